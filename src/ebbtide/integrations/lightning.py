"""A PyTorch Lightning callback: checkpoint on the eviction warning, exit 99, resume.

Needs ``lightning`` (``pip install 'ebbtide[lightning]'``); for the older
``pytorch_lightning`` package use :mod:`ebbtide.integrations.pytorch_lightning`::

    from ebbtide.integrations.lightning import EbbtideCallback, last_checkpoint

    trainer = L.Trainer(..., callbacks=[EbbtideCallback()])
    trainer.fit(model, data, ckpt_path=last_checkpoint())

What it does, and when, is in :mod:`ebbtide.integrations.lightning_hooks`.
"""

from __future__ import annotations

from lightning.pytorch import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from ebbtide.integrations.lightning_hooks import LightningHooks, last_checkpoint

__all__ = ["EbbtideCallback", "last_checkpoint"]


class EbbtideCallback(LightningHooks, Callback):
    """On ebbtide's eviction warning: save a full checkpoint at the end of the current
    step, report it, exit 99 (requeue).  Reports progress (global step of the total).

    Args:
      keep: warning-time checkpoints kept (the newest), default 2.
      progress_interval_s: least time between two progress reports, in seconds.
    """

    _sigterm_exception = SIGTERMException
