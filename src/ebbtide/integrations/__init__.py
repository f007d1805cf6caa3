"""Framework callbacks: checkpoint on the eviction warning, requeue, resume.

One module per framework; each imports its framework, so import the one you use:

=========================================== ============================================
``ebbtide.integrations.lightning``          ``lightning.pytorch``
                                            (``pip install 'ebbtide[lightning]'``)
``ebbtide.integrations.pytorch_lightning``  the same, for the older ``pytorch_lightning``
``ebbtide.integrations.transformers``       Hugging Face ``transformers.Trainer``
                                            (``pip install 'ebbtide[transformers]'``)
=========================================== ============================================

Each gives an ``EbbtideCallback`` and ``last_checkpoint()``; three lines make a training
script resumable under ebbtide::

    from ebbtide.integrations.lightning import EbbtideCallback, last_checkpoint

    trainer = L.Trainer(..., callbacks=[EbbtideCallback()])
    trainer.fit(model, data, ckpt_path=last_checkpoint())

On the eviction warning the callback lets the current training step finish, saves a full
checkpoint the framework's way, tells the node agent (a status line; ``ebb qstat -f``
shows the checkpoint) and exits with code 99; the next attempt's ``last_checkpoint()`` is that
checkpoint.  Periodic checkpoints stay the framework's business.

This package itself imports nothing heavy.
"""
