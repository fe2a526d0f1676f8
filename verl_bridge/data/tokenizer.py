"""The run's task and tokenizer.

A built-in task (``data.task``, when ``data.train_files`` is not set) brings its own toy
tokenizer; prompt files need the actor's Hugging Face tokenizer, read from the local
``model.actor.args.model_name_or_path`` (relative to the config first, then to the working
directory; never downloaded). A tokenizer passed to :class:`verl_bridge.MegatronBridge` wins.
"""

from __future__ import annotations

from verl_bridge.data.files import local_dir


class TokenizerError(RuntimeError):
    pass


def builtin_task(config):
    """The built-in task of ``data.task``, or None when prompts come from ``data.train_files``."""
    from verl_bridge.rewards import get_task

    return get_task(config.data.task) if config.data.train_files is None else None


def load_tokenizer(config, task=None):
    """The task's toy tokenizer, or the actor's HF tokenizer from its local directory."""
    if task is not None:
        from verl_bridge.rewards import ToyTokenizer

        return ToyTokenizer()
    path = local_dir(config.model.actor.args.model_name_or_path, config.source_dir,
                     config.model.actor.args.revision)
    if not path:
        raise TokenizerError("data.train_files needs a tokenizer: set model.actor.args.model_name_or_path "
                             "to a local HF directory with tokenizer files, or pass tokenizer= to MegatronBridge")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)
