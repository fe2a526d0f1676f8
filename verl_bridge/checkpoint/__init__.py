"""Megatron-LM compatible checkpoints (legacy and torch_dist), trainer resume, HF import/export."""


def load_model_weights(model, path, iteration=None) -> None:
    """Load a Megatron checkpoint directory's weights for this rank into ``model``."""
    from verl_bridge.checkpoint import megatron

    megatron.load(path, iteration, model=model)
