"""Distil a small cross-vocabulary drafter for a target (issue 7).

The steps, each resumable and each its own module:

* `prompts`: HumanEval-style prompts (signature + docstring) cut from the Python standard
  library that ships with the interpreter, so the data exists offline and never overlaps the
  evaluation prompts (HumanEval's entry points are excluded by name);
* `teacher`: the target continues those prompts (batched, greedy and sampled); shards of
  text are written atomically, so a restart skips finished shards (sequence-level distillation);
* `onpolicy` (optional): a drafter continues the same prompts and the target scores its text
  (DistillSpec's on-policy data), in the teacher's shard format;
* `student`: a small Llama-architecture LM whose vocabulary is any tokenizer, trained on the
  teacher's text re-tokenized with that tokenizer (optionally mixed with raw standard-library
  source), checkpointed every few steps, saved as a standard Hugging Face checkpoint.

`experiments.drafters.train` is the Hydra entry that runs all three.
"""
from xvocab.drafter.prompts import code_prompts, raw_code
from xvocab.drafter.student import StudentShape, build_student, save_student, train_student
from xvocab.drafter.teacher import generate_teacher_text, read_teacher_text

__all__ = ["code_prompts", "raw_code", "generate_teacher_text", "read_teacher_text", "StudentShape",
           "build_student", "train_student", "save_student"]
