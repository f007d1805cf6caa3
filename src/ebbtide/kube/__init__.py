"""The Kubernetes executor's pure parts: resource profiles (:mod:`.profiles`) turn a job's
slice request into what a node really grants and the resources a pod asks for; the pod
builder (:mod:`.pods`) turns an attempt into the Pod manifest the executor creates."""
