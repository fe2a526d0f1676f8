"""What a run consumes besides models: prompts, the tokenizer, the reward function.

* :mod:`.files`: JSONL / Parquet prompt rows (``data.train_files``, ``data.eval_files``);
* :mod:`.prompts`: each step's prompts and the held-out prompts of evaluations;
* :mod:`.tokenizer`: the built-in task and the tokenizer;
* :mod:`.reward`: the reward function of the config.
"""

from verl_bridge.data.files import GroundTruth, PromptFileError, load_prompt_file  # noqa: F401
