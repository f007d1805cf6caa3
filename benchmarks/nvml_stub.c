/*
 * A stand-in for libnvidia-ml.so.1: the NVML calls the node agent makes, answered from a
 * machine declared through the ebbstub_* functions, each call spending a set time busy.
 *
 * What it is for: running the agent over the real nvidia-ml-py bindings (pynvml's
 * ctypes structures, its function-pointer cache, its friendly objects) on a machine
 * without a GPU, so that benchmarks/agent_overhead.py measures what pynvml itself costs
 * in Python, and what a call costs in C is a figure it sets (``ebbstub_set_call_cost_ns``)
 * rather than the fake's Python standing for both.  benchmarks/nvml_stub.py builds it
 * (``cc -shared``) and loads it before pynvml does: its soname is libnvidia-ml.so.1, so
 * pynvml's ``CDLL("libnvidia-ml.so.1")`` finds it already loaded.
 *
 * What it is not: NVML.  Only whole GPUs (MIG mode: not supported), compute processes
 * (no graphics ones), per-process SM samples, and XID events that never come (a wait
 * sleeps its timeout).  Layouts follow nvml.h (the _v3 process info, the _v2 calls).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define STUB_MAX_GPUS 64
#define STUB_MAX_PROCS 256

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_TIMEOUT = 10,
};

#define NVML_EVENT_TYPE_XID_CRITICAL_ERROR 0x8ULL

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned int valueType, nvmlReturn;
    unsigned long long value;
} nvmlFieldValue_t;

typedef struct {
    void *device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

struct stub_proc {
    unsigned int pid;
    unsigned long long memory_b;
    unsigned int sm_pct;
};

struct stub_gpu {
    unsigned long long total_b, reserved_b;
    unsigned int utilization_pct;
    int nprocs;
    struct stub_proc procs[STUB_MAX_PROCS];
};

static struct stub_gpu gpus[STUB_MAX_GPUS];
static int ngpus;
static int initialised;
static int event_set;
static long long call_cost_ns;
static int call_sleeps; /* spend a call's cost asleep rather than busy */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* calls counted by name (the entry points' names, as pynvml asks for them) */
static const char *const call_names[] = {
    "nvmlInitWithFlags",
    "nvmlInit_v2",
    "nvmlShutdown",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
};
#define NCALLS (sizeof(call_names) / sizeof(call_names[0]))
static unsigned long long calls[NCALLS];

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* A call begins: count it, and return when it may end.  Its cost is spent busy by
 * default, as an ioctl's time is the caller's CPU, or asleep (ebbstub_set_call_cost_ns). */
static long long enter(int id) {
    __atomic_add_fetch(&calls[id], 1, __ATOMIC_RELAXED);
    return now_ns() + __atomic_load_n(&call_cost_ns, __ATOMIC_RELAXED);
}

static int leave(long long done_at, int ret) {
    long long left;
    if (__atomic_load_n(&call_sleeps, __ATOMIC_RELAXED)) {
        if ((left = done_at - now_ns()) > 0) {
            struct timespec ts = {left / 1000000000LL, left % 1000000000LL};
            nanosleep(&ts, NULL);
        }
        return ret;
    }
    while (now_ns() < done_at) {
    }
    return ret;
}

static struct stub_gpu *gpu_of(void *handle) {
    struct stub_gpu *g = handle;
    if (g < gpus || g >= gpus + ngpus)
        return NULL;
    return g;
}

static unsigned long long used_b(const struct stub_gpu *g) {
    unsigned long long used = g->reserved_b;
    for (int i = 0; i < g->nprocs; i++)
        used += g->procs[i].memory_b;
    return used;
}

/* ---- declaring the machine (not NVML) ---------------------------------------------- */

int ebbstub_reset(int n, unsigned long long total_b, unsigned long long reserved_b) {
    if (n < 0 || n > STUB_MAX_GPUS || reserved_b > total_b)
        return -1;
    pthread_mutex_lock(&lock);
    memset(gpus, 0, sizeof(gpus));
    ngpus = n;
    for (int i = 0; i < n; i++) {
        gpus[i].total_b = total_b;
        gpus[i].reserved_b = reserved_b;
    }
    memset(calls, 0, sizeof(calls));
    pthread_mutex_unlock(&lock);
    return 0;
}

int ebbstub_set_process(int gpu, unsigned int pid, unsigned long long memory_b,
                        unsigned int sm_pct) {
    int ret = -1;
    if (gpu < 0 || gpu >= ngpus || sm_pct > 100)
        return -1;
    pthread_mutex_lock(&lock);
    struct stub_gpu *g = &gpus[gpu];
    for (int i = 0; i < g->nprocs; i++) {
        if (g->procs[i].pid == pid) {
            g->procs[i].memory_b = memory_b;
            g->procs[i].sm_pct = sm_pct;
            ret = 0;
            goto out;
        }
    }
    if (g->nprocs < STUB_MAX_PROCS) {
        g->procs[g->nprocs++] = (struct stub_proc){pid, memory_b, sm_pct};
        ret = 0;
    }
out:
    pthread_mutex_unlock(&lock);
    return ret;
}

int ebbstub_remove_process(int gpu, unsigned int pid) {
    int ret = -1;
    if (gpu < 0 || gpu >= ngpus)
        return -1;
    pthread_mutex_lock(&lock);
    struct stub_gpu *g = &gpus[gpu];
    for (int i = 0; i < g->nprocs; i++) {
        if (g->procs[i].pid == pid) {
            g->procs[i] = g->procs[--g->nprocs];
            ret = 0;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return ret;
}

int ebbstub_set_utilization(int gpu, unsigned int pct) {
    if (gpu < 0 || gpu >= ngpus || pct > 100)
        return -1;
    pthread_mutex_lock(&lock);
    gpus[gpu].utilization_pct = pct;
    pthread_mutex_unlock(&lock);
    return 0;
}

/* Every NVML call takes at least ``ns``, spent busy (``sleeps`` 0) or asleep. */
void ebbstub_set_call_cost_ns(long long ns, int sleeps) {
    __atomic_store_n(&call_cost_ns, ns < 0 ? 0 : ns, __ATOMIC_RELAXED);
    __atomic_store_n(&call_sleeps, sleeps != 0, __ATOMIC_RELAXED);
}

/* How many times the entry point ``name`` was called since the last reset (-1: not
 * one of this stub's). */
long long ebbstub_calls(const char *name) {
    for (unsigned i = 0; i < NCALLS; i++)
        if (strcmp(call_names[i], name) == 0)
            return (long long)__atomic_load_n(&calls[i], __ATOMIC_RELAXED);
    return -1;
}

int ebbstub_call_count(void) { return (int)NCALLS; }

const char *ebbstub_call_name(int i) {
    return i >= 0 && i < (int)NCALLS ? call_names[i] : NULL;
}

/* ---- NVML --------------------------------------------------------------------------- */

const char *nvmlErrorString(int ret) {
    switch (ret) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    default: return "Unknown Error";
    }
}

int nvmlInitWithFlags(unsigned int flags) {
    long long t = enter(0);
    (void)flags;
    __atomic_add_fetch(&initialised, 1, __ATOMIC_RELAXED);
    return leave(t, NVML_SUCCESS);
}

int nvmlInit_v2(void) {
    long long t = enter(1);
    __atomic_add_fetch(&initialised, 1, __ATOMIC_RELAXED);
    return leave(t, NVML_SUCCESS);
}

int nvmlShutdown(void) {
    long long t = enter(2);
    if (__atomic_load_n(&initialised, __ATOMIC_RELAXED) <= 0)
        return leave(t, NVML_ERROR_UNINITIALIZED);
    __atomic_sub_fetch(&initialised, 1, __ATOMIC_RELAXED);
    return leave(t, NVML_SUCCESS);
}

int nvmlDeviceGetCount_v2(unsigned int *count) {
    long long t = enter(3);
    if (!count)
        return leave(t, NVML_ERROR_INVALID_ARGUMENT);
    *count = (unsigned int)ngpus;
    return leave(t, NVML_SUCCESS);
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
    long long t = enter(4);
    if (!device || index >= (unsigned int)ngpus)
        return leave(t, NVML_ERROR_INVALID_ARGUMENT);
    *device = &gpus[index];
    return leave(t, NVML_SUCCESS);
}

int nvmlDeviceGetIndex(void *device, unsigned int *index) {
    long long t = enter(5);
    struct stub_gpu *g = gpu_of(device);
    if (!g || !index)
        return leave(t, NVML_ERROR_INVALID_ARGUMENT);
    *index = (unsigned int)(g - gpus);
    return leave(t, NVML_SUCCESS);
}

int nvmlDeviceGetMigMode(void *device, unsigned int *current, unsigned int *pending) {
    long long t = enter(6);
    (void)current;
    (void)pending;
    if (!gpu_of(device))
        return leave(t, NVML_ERROR_INVALID_ARGUMENT);
    return leave(t, NVML_ERROR_NOT_SUPPORTED);
}

int nvmlDeviceGetName(void *device, char *name, unsigned int length) {
    long long t = enter(7);
    if (!gpu_of(device) || !name)
        return leave(t, NVML_ERROR_INVALID_ARGUMENT);
    const char *stub_name = "Stub H100 80GB HBM3";
    if (length < strlen(stub_name) + 1)
        return leave(t, NVML_ERROR_INSUFFICIENT_SIZE);
    strcpy(name, stub_name);
    return leave(t, NVML_SUCCESS);
}

int nvmlDeviceGetUUID(void *device, char *uuid, unsigned int length) {
    long long t = enter(8);
    struct stub_gpu *g = gpu_of(device);
    if (!g || !uuid)
        return leave(t, NVML_ERROR_INVALID_ARGUMENT);
    int n = snprintf(uuid, length, "GPU-57ab0000-0000-0000-0000-%012d", (int)(g - gpus));
    if (n < 0 || (unsigned int)n >= length)
        return leave(t, NVML_ERROR_INSUFFICIENT_SIZE);
    return leave(t, NVML_SUCCESS);
}

int nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *memory) {
    long long t = enter(9);
    struct stub_gpu *g = gpu_of(device);
    if (!g || !memory)
        return leave(t, NVML_ERROR_INVALID_ARGUMENT);
    pthread_mutex_lock(&lock);
    unsigned long long used = used_b(g);
    pthread_mutex_unlock(&lock);
    memory->total = g->total_b;
    memory->used = used < g->total_b ? used : g->total_b;
    memory->free = g->total_b - memory->used;
    return leave(t, NVML_SUCCESS);
}

int nvmlDeviceGetUtilizationRates(void *device, nvmlUtilization_t *utilization) {
    long long t = enter(10);
    struct stub_gpu *g = gpu_of(device);
    if (!g || !utilization)
        return leave(t, NVML_ERROR_INVALID_ARGUMENT);
    utilization->gpu = g->utilization_pct;
    utilization->memory = 0;
    return leave(t, NVML_SUCCESS);
}

/* NVML's contract: a count too small (or no array) answers INSUFFICIENT_SIZE with the
 * count needed, except that no process at all is SUCCESS with a count of 0. */
int nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *count,
                                            nvmlProcessInfo_t *infos) {
    long long t = enter(11);
    struct stub_gpu *g = gpu_of(device);
    int ret = NVML_SUCCESS;
    if (!g || !count)
        return leave(t, NVML_ERROR_INVALID_ARGUMENT);
    pthread_mutex_lock(&lock);
    unsigned int n = (unsigned int)g->nprocs;
    if (n > 0 && (infos == NULL || *count < n)) {
        ret = NVML_ERROR_INSUFFICIENT_SIZE;
    } else {
        for (unsigned int i = 0; i < n; i++)
            infos[i] = (nvmlProcessInfo_t){g->procs[i].pid, g->procs[i].memory_b,
                                           0xFFFFFFFFu, 0xFFFFFFFFu};
    }
    *count = n;
    pthread_mutex_unlock(&lock);
    return leave(t, ret);
}

int nvmlDeviceGetGraphicsRunningProcesses_v3(void *device, unsigned int *count,
                                             nvmlProcessInfo_t *infos) {
    long long t = enter(12);
    (void)infos;
    if (!gpu_of(device) || !count)
        return leave(t, NVML_ERROR_INVALID_ARGUMENT);
    *count = 0;
    return leave(t, NVML_SUCCESS);
}

/* One sample per process with SMs in use, stamped now (Unix microseconds, as NVML's);
 * none, or none newer than ``last_seen``: NOT_FOUND, as NVML says. */
int nvmlDeviceGetProcessUtilization(void *device, nvmlProcessUtilizationSample_t *samples,
                                    unsigned int *count, unsigned long long last_seen) {
    long long t = enter(13);
    struct stub_gpu *g = gpu_of(device);
    int ret = NVML_SUCCESS;
    if (!g || !count)
        return leave(t, NVML_ERROR_INVALID_ARGUMENT);
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall); /* NVML stamps samples in Unix microseconds */
    unsigned long long stamp_us =
        (unsigned long long)wall.tv_sec * 1000000ULL + (unsigned long long)wall.tv_nsec / 1000;
    pthread_mutex_lock(&lock);
    unsigned int n = 0;
    for (int i = 0; i < g->nprocs; i++)
        n += g->procs[i].sm_pct > 0;
    if (n == 0 || stamp_us <= last_seen) {
        n = 0;
        ret = NVML_ERROR_NOT_FOUND;
    } else if (samples == NULL || *count < n) {
        ret = NVML_ERROR_INSUFFICIENT_SIZE;
    } else {
        unsigned int k = 0;
        for (int i = 0; i < g->nprocs; i++)
            if (g->procs[i].sm_pct > 0)
                samples[k++] = (nvmlProcessUtilizationSample_t){
                    g->procs[i].pid, stamp_us, g->procs[i].sm_pct, 0, 0, 0};
    }
    *count = n;
    pthread_mutex_unlock(&lock);
    return leave(t, ret);
}

/* No field is known: each entry answers NOT_SUPPORTED (the call itself succeeds). */
int nvmlDeviceGetFieldValues(void *device, int count, nvmlFieldValue_t *values) {
    long long t = enter(14);
    if (!gpu_of(device) || count < 0 || (count > 0 && !values))
        return leave(t, NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < count; i++)
        values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
    return leave(t, NVML_SUCCESS);
}

int nvmlDeviceGetSupportedEventTypes(void *device, unsigned long long *types) {
    long long t = enter(15);
    if (!gpu_of(device) || !types)
        return leave(t, NVML_ERROR_INVALID_ARGUMENT);
    *types = NVML_EVENT_TYPE_XID_CRITICAL_ERROR;
    return leave(t, NVML_SUCCESS);
}

int nvmlEventSetCreate(void **set) {
    long long t = enter(16);
    if (!set)
        return leave(t, NVML_ERROR_INVALID_ARGUMENT);
    *set = &event_set;
    return leave(t, NVML_SUCCESS);
}

int nvmlDeviceRegisterEvents(void *device, unsigned long long types, void *set) {
    long long t = enter(17);
    if (!gpu_of(device) || set != &event_set || (types & ~NVML_EVENT_TYPE_XID_CRITICAL_ERROR))
        return leave(t, NVML_ERROR_INVALID_ARGUMENT);
    return leave(t, NVML_SUCCESS);
}

/* No event ever comes: the wait lasts its timeout (asleep, as a real one blocks). */
int nvmlEventSetWait_v2(void *set, nvmlEventData_t *data, unsigned int timeout_ms) {
    long long t = enter(18);
    (void)data;
    if (set != &event_set)
        return leave(t, NVML_ERROR_INVALID_ARGUMENT);
    leave(t, NVML_SUCCESS);
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    return NVML_ERROR_TIMEOUT;
}

int nvmlEventSetFree(void *set) {
    long long t = enter(19);
    if (set != &event_set)
        return leave(t, NVML_ERROR_INVALID_ARGUMENT);
    return leave(t, NVML_SUCCESS);
}
