"""The Lightning callback for the older package name, ``pytorch_lightning``.

A callback must come from the same package as the ``Trainer`` it is given to; with
``import pytorch_lightning as pl``::

    from ebbtide.integrations.pytorch_lightning import EbbtideCallback, last_checkpoint

    trainer = pl.Trainer(..., callbacks=[EbbtideCallback()])
    trainer.fit(model, data, ckpt_path=last_checkpoint())

What it does, and when, is in :mod:`ebbtide.integrations.lightning_hooks`.
"""

from __future__ import annotations

from pytorch_lightning import Callback
from pytorch_lightning.utilities.exceptions import SIGTERMException

from ebbtide.integrations.lightning_hooks import LightningHooks, last_checkpoint

__all__ = ["EbbtideCallback", "last_checkpoint"]


class EbbtideCallback(LightningHooks, Callback):
    """:class:`ebbtide.integrations.lightning.EbbtideCallback` for ``pytorch_lightning``."""

    _sigterm_exception = SIGTERMException
