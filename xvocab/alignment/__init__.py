"""Relating a draft vocabulary to a target vocabulary: id intersection and string translation."""
from xvocab.alignment.intersection import NO_TOKEN, VocabMap, intersection
from xvocab.alignment.translate import Stream, reference_sync, sync

__all__ = ["NO_TOKEN", "Stream", "VocabMap", "intersection", "reference_sync", "sync"]
