"""Training data: rows from files or the hub -> messages or text -> token ids and loss masks
-> packed rows of sequence_len -> micro-batches for the trainer.

The trainer needs::

    train, evaluation = build_datasets(config, tokenizer)     # evaluation may be None
    batches = train.iterator(config.per_device_train_batch_size, position=saved_or_(0, 0))
    batch = next(batches)      # Batch: input_ids, position_ids, cu_seqlens, targets (int32), num_target_tokens
    batches.position           # BatchPosition(epoch, index) of the next batch: store it in checkpoints
    train.num_batches(B)       # micro-batches per epoch
    for batch in evaluation.batches(B, shuffle=False): ...

Each stage is one module: ``sources`` (files -> rows), ``formats`` (rows -> Conversation or
Document), ``tokenize`` (-> ids + loss mask), ``packing`` (-> rows and Batch), ``cache`` (on
disk), ``dataset`` (all of it, per config).
"""

from __future__ import annotations

from surogate.train.data.dataset import BatchIterator, BatchPosition, DataStats, PackedDataset, build_datasets
from surogate.train.data.formats import Conversation, Document, RowError, normalize
from surogate.train.data.packing import IGNORE, Batch, Documents, PackPlan, collate, pack, split_rows
from surogate.train.data.tokenize import ChatEncoder, Encoded

__all__ = [
    "IGNORE", "Batch", "BatchIterator", "BatchPosition", "ChatEncoder", "Conversation", "DataStats", "Document",
    "Documents", "Encoded", "PackPlan", "PackedDataset", "RowError", "build_datasets", "collate", "normalize", "pack",
    "split_rows",
]
