"""PPO on an unchanged Megatron-LM-style script (train_megatron.py) through verl-bridge.

    python examples/custom_model_provider/rl.py <the script's Megatron flags> --load CKPT_DIR

``ppo.yaml`` names the script's hooks as strings. The same in Python, with the callables::

    import train_megatron as script
    bridge = MegatronBridge(script.model_provider, script.initialize_megatron, script.load_checkpoint)
    MegatronTrainer(bridge.load_config("ppo.yaml"), bridge=bridge).train()
"""

import os

from verl_bridge import MegatronTrainer

if __name__ == "__main__":
    MegatronTrainer(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ppo.yaml")).train()
