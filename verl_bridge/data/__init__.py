"""Training data: prompt files (:mod:`.files`) and the prompts of each step (:mod:`.prompts`)."""

from verl_bridge.data.files import GroundTruth, PromptFileError, load_prompt_file  # noqa: F401
