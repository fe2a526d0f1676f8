"""loops.py: which loop trains, which code runs it, and the loop's shape."""

import libcst as cst

from .helpers import GRPO, recognizer


def test_main_function_entry():
    r = recognizer(GRPO)
    assert r.a.status == "migrate" and r.a.entry.name == "main" and r.a.block is None
    assert r.a.config["trainer.total_steps"] == 10


def test_module_level_loop_is_a_block():
    src = GRPO.replace("def main():\n", "if True:\n").replace('if __name__ == "__main__":\n    main()\n', "")
    r = recognizer(src)
    assert r.a.status == "migrate", r.a.reasons
    kind, index, removed = r.a.block
    assert kind == "module" and isinstance(r.p.module.body[index], cst.If)


def test_method_loop_reached_from_main_guard():
    src = GRPO.replace("def main():\n", "class T:\n    def train(self):\n").replace(
        '    main()\n', '    T().train()\n')
    src = "\n".join(("    " + line if line.startswith("    ") and "def train" not in line and "class T" not in line
                     and "T().train()" not in line else line) for line in src.splitlines())
    r = recognizer(src)
    assert r.a.status == "migrate", r.a.reasons
    assert r.a.block[0] == "main" and r.a.removed_defs  # the class that held the loop goes too


def test_no_substring_guessing_on_function_names():
    r = recognizer("""
        from transformers import AutoModel
        def log_train(x): print(x)
        def main():
            m = AutoModel.from_pretrained("./m")
            log_train(m)
        """)
    assert r.a.status == "refuse"
    assert not any("from_pretrained" in x or "log_train" in x for x in r.a.reasons)


def test_epochs_and_minibatches_from_nested_ranges():
    src = GRPO.replace("        new = lp(model, out)\n", "        for e in range(3):\n          for s in range(0, 64, 16):\n"
                       "            new = lp(model, out)\n")
    src = src.replace("        ratio = torch.exp", "            ratio = torch.exp").replace(
        "        pg = ", "            pg = ").replace("        kl = new", "            kl = new").replace(
        "        loss = (pg", "            loss = (pg").replace("        loss.backward", "            loss.backward").replace(
        "        opt.step", "            opt.step")
    r = recognizer(src)
    assert r.a.status == "migrate", r.a.reasons
    assert r.a.config["algorithm.ppo_epochs"] == 3 and r.a.config["algorithm.mini_batch_size"] == 16
