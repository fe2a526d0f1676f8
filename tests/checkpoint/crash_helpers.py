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
