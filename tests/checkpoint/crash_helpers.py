"""Helpers for the crash test: an object whose pickling announces itself and then blocks."""

import os


class BlockWhilePickled:
    def __init__(self, ready_fd: int, block_fd: int):
        self.ready_fd, self.block_fd = ready_fd, block_fd

    def __reduce__(self):
        os.write(self.ready_fd, b"x")  # the save is now in the middle of writing its file
        os.read(self.block_fd, 1)  # wait here until SIGKILL
        return (int, (0,))


def save_then_hang(save_dir, fmt, ready_fd, block_fd):
    import torch

    from verl_bridge.checkpoint.megatron import save

    torch.manual_seed(0)
    save(save_dir, 1, {"model": {"w": torch.randn(4, 4)}, "iteration": 1, "extra": {"data_position": 1}}, fmt=fmt)
    save(save_dir, 2, {"model": {"w": torch.randn(4, 4)}, "iteration": 2,
                       "extra": {"data_position": 2, "hang": BlockWhilePickled(ready_fd, block_fd)}}, fmt=fmt)


def train_then_hang_between_roles(config_args, ready_fd, block_fd, hang_step):
    """Train with the quickstart config; at step *hang_step*'s publish, block right after the critic
    is renamed into place and before the actor is (the boundary a SIGKILL must survive)."""
    from pathlib import Path

    from verl_bridge.checkpoint import megatron as mckpt
    from verl_bridge.config import load_config
    from verl_bridge.runtime.trainer import MegatronTrainer

    real = mckpt.publish

    def publish(save_dir, tmp, iteration, keep_last=None, *, tracker=True):
        final = real(save_dir, tmp, iteration, keep_last, tracker=tracker)
        if iteration == hang_step and Path(save_dir).name == "critic":
            os.write(ready_fd, b"x")
            os.read(block_fd, 1)  # wait here until SIGKILL
        return final

    mckpt.publish = publish
    MegatronTrainer(load_config("templates/quickstart.yaml", list(config_args))).train()
