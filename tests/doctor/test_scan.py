"""--scan: megatron names missing from the installed megatron-core, found with ast only."""

from __future__ import annotations

from .fakeenv import FakeEnv

USER_CODE = """\
from megatron.core import parallel_state as mpu
from megatron.core.parallel_state import get_data_modulo_expert_parallel_rank
from megatron.core.transformer.custom_layers.transformer_engine import TENorm
from megatron.core.models.gpt import GPTModel
from megatron.core.not_a_module import thing

group = mpu.get_data_modulo_expert_parallel_group()
fine = mpu.get_expert_data_parallel_group()
model = GPTModel(config=None, model_comm_pgs=None)
"""


def _fake_core(fake: FakeEnv) -> None:
    fake.megatron_core("0.13.1")
    fake.file("megatron/core/parallel_state.py", """
        import warnings
        def get_expert_data_parallel_group():
            pass
        def get_data_modulo_expert_parallel_group():
            warnings.warn("deprecated")
            return get_expert_data_parallel_group()
        """)
    fake.file("megatron/core/models/__init__.py", "")
    fake.file("megatron/core/models/gpt/__init__.py", "from .gpt_model import GPTModel\n")
    fake.file("megatron/core/models/gpt/gpt_model.py", "class GPTModel:\n    pass\n")
    fake.file("megatron/core/transformer/__init__.py", "")
    fake.file("megatron/core/transformer/custom_layers/__init__.py", "")
    fake.file("megatron/core/transformer/custom_layers/transformer_engine.py", "from megatron.core.extensions.transformer_engine import *\n")


def test_scan_reports_missing_and_renamed(fake: FakeEnv):
    _fake_core(fake)
    code = fake.file("proj/train.py", USER_CODE)
    fake.file("proj/broken.py", "def (:\n")
    run = fake.run("--scan", str(code.parent), "--json")
    assert run.rc == 1, run
    data = run.json()
    assert data["megatron_core"] == "0.13.1"
    by_line = {f["line"]: f for f in data["findings"]}
    assert by_line[2]["status"] == "missing"
    assert by_line[2]["replacement"] == "megatron.core.parallel_state.get_expert_data_parallel_rank"
    assert by_line[2]["version"] == "0.10"
    assert by_line[3]["status"] == "deprecated"
    assert by_line[3]["replacement"] == "megatron.core.extensions.transformer_engine.TENorm"
    assert by_line[5]["status"] == "missing" and "megatron.core.not_a_module" in by_line[5]["message"]
    assert by_line[7]["status"] == "deprecated" and by_line[7]["version"] == "0.10"
    assert by_line[9]["status"] == "renamed-keyword" and by_line[9]["replacement"] == "pg_collection"
    assert 4 not in by_line and 8 not in by_line  # names that exist are not reported
    assert any("broken.py" in n for n in data["notes"])


def test_scan_clean_code_exits_zero(fake: FakeEnv):
    _fake_core(fake)
    code = fake.file("ok.py", "from megatron.core.models.gpt import GPTModel\nimport os\n")
    run = fake.run("--scan", str(code))
    assert run.rc == 0 and "no megatron names" in run.out


def test_scan_against_the_installed_megatron_core(tmp_path):
    """The real megatron-core of this machine (0.16.1): still read with ast, never imported."""
    env = FakeEnv(tmp_path, isolated=False)
    code = env.file("t.py", "from megatron.core.parallel_state import get_tensor_and_expert_parallel_group\n"
                            "from megatron.core.parallel_state import get_expert_tensor_and_model_parallel_group\n")
    run = env.run("--scan", str(code), "--json")
    findings = run.json()["findings"]
    assert [f["line"] for f in findings] == [1]
    assert findings[0]["replacement"].endswith("get_expert_tensor_and_model_parallel_group")
    assert run.rc == 1 and run.elapsed < 5


def test_scan_megatron_lm_checkout_shape(fake: FakeEnv):
    """A Megatron-LM checkout's shape (our own small tree): its vendored megatron/core is not scanned,
    its own megatron.training resolves, Megatron-LM names are not called "missing from megatron-core",
    repeated findings are grouped and the summary comes first."""
    _fake_core(fake)
    import shutil
    shutil.rmtree(fake.site / "megatron" / "training")  # the megatron-core wheel (< 0.17) has no megatron.training
    lm = fake.root / "Megatron-LM"
    fake.file("megatron/core/__init__.py", "from megatron.core.not_there import x\n", where=lm)
    fake.file("megatron/core/parallel_state.py", "from megatron.core.gone import y\n", where=lm)
    fake.file("megatron/training/__init__.py", "from .global_vars import get_args\n", where=lm)
    fake.file("megatron/training/global_vars.py", "def get_args():\n    pass\n", where=lm)
    fake.file("pretrain_gpt.py", "from megatron.training import get_args\nfrom megatron.core.models.gpt import GPTModel\n",
              where=lm)
    run = fake.run("--scan", str(lm), "--json")
    data = run.json()
    assert data["findings"] == [] and run.rc == 0, data  # nothing from the vendored megatron/core
    user = fake.root / "user"
    for i in range(5):
        fake.file(f"train_{i}.py", "from megatron.training import get_args\nfrom megatron import mpu\n"
                                    "mpu.get_tensor_model_parallel_rank()\n", where=user)
    run = fake.run("--scan", str(user))
    lines = run.out.splitlines()
    assert lines[1].startswith("15 findings in 5 files:") and "Megatron-LM names" in lines[1], run.out
    assert "missing from the installed" not in lines[1]
    assert sum("megatron.training (5x)" in ln for ln in lines) == 1
    assert "fix: use megatron.core.parallel_state" in run.out
    assert run.rc == 0  # Megatron-LM names are information, not errors (--strict makes them count)
    assert fake.run("--scan", str(user), "--strict").rc == 1
