"""Codemod: rewrite a hand-written PPO/GRPO loop into ``MegatronTrainer(config).train()``.

Usable three ways:

* ``verl-bridge migrate train_ppo.py`` (dry run, diff + YAML + report; ``--write`` applies);
* ``python -m libcst.tool codemod migrate_ppo_loop.MigratePPOLoopCommand train_ppo.py`` with
  ``verl_bridge.codemods`` in the ``modules`` list of ``.libcst.codemod.yaml`` (writes the YAML
  config next to the script as well);
* in Python, ``MigratePPOLoopCommand(CodemodContext(filename=...)).transform_module(tree)``.

What the rewrite does: the function that runs the loop (the one ``if __name__ == "__main__"``
calls) keeps its signature, decorators, docstring and comments above it; its body becomes::

    config = load_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_ppo.yaml"))
    MegatronTrainer(config).train()

A ``try/except KeyboardInterrupt`` around the loop is kept around the trainer call. Every other
top-level definition (``model_provider``, ``initialize_megatron``, ``load_checkpoint``, the reward
function, helpers, ``# %%`` cells) is left byte for byte. Imports that only the old loop used are
removed, ``import os`` and ``from verl_bridge import MegatronTrainer, load_config`` are added.

When the recogniser is not certain, the file is skipped (``SkipFile``) with the reasons.
"""

from __future__ import annotations

import argparse
import builtins
import json
import os
from collections import Counter
from typing import Optional

import libcst as cst
from libcst.codemod import CodemodContext, SkipFile, VisitorBasedCodemodCommand

from .recognize import Analysis, analyze
from ._static import Program, walk


def module_name_for(filename: Optional[str]) -> str:
    base = os.path.basename(filename or "train_ppo.py")
    return os.path.splitext(base)[0]


class MigratePPOLoopCommand(VisitorBasedCodemodCommand):
    DESCRIPTION = "Rewrite a hand-written PPO/GRPO loop into MegatronTrainer(config).train() (verl-bridge)."

    def __init__(self, context: CodemodContext, config_path: Optional[str] = None, write_config: bool = False,
                 source_dir: Optional[str] = None, source: Optional[bytes] = None) -> None:
        super().__init__(context)
        self.source = source  # the bytes *tree* was parsed from (line numbers come from Python's parser)
        self.config_path = config_path
        self.write_config = write_config
        self.source_dir = source_dir
        self.analysis: Optional[Analysis] = None

    @staticmethod
    def add_args(arg_parser: argparse.ArgumentParser) -> None:
        arg_parser.add_argument(
            "--config-path", dest="config_path", default=None,
            help="YAML path the rewritten script loads, relative to the script (default: <script>.yaml)")
        arg_parser.add_argument(
            "--no-write-config", dest="write_config", action="store_false", default=True,
            help="do not write the YAML config next to the script")

    # ------------------------------------------------------------------ analysis
    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        filename = self.context.filename or "train_ppo.py"
        module_name = module_name_for(filename)
        importable = module_name.isidentifier()
        if not importable:
            import re as _re

            module_name = _re.sub(r"\W", "_", module_name)
            if not module_name[:1].isalpha() and module_name[:1] != "_":
                module_name = "_" + module_name
        source_dir = self.source_dir
        if source_dir is None and self.context.filename:
            source_dir = os.path.dirname(os.path.abspath(self.context.filename))
        prog = Program(tree, os.path.basename(filename), source_dir=source_dir, source=self.source)
        analysis = analyze(prog, module_name)
        if analysis.status == "migrate" and not importable:
            analysis.warn(f"the file name {os.path.basename(filename)!r} is not an importable module name; the "
                          f"config refers to its functions as module {module_name!r}: copy or rename the script "
                          f"to {module_name}.py before training if the config names any of its hooks")
        self.analysis = analysis
        self.prog = prog
        if analysis.status == "refuse":
            raise SkipFile("refused: " + "; ".join(analysis.reasons))
        if analysis.status == "unchanged":
            return tree
        self.config_rel = self.config_path or f"{module_name}.yaml"
        gone = self._removed_names(prog, analysis)
        if analysis.block is not None:
            new = self._rewrite_block(tree, analysis.block)
        else:
            new = self._rewrite_entry(tree, analysis.entry.node)
        new = _edit_imports(new, prog, gone)
        if self.write_config and self.context.filename:
            from verl_bridge.migrate.yamlout import render_yaml
            from verl_bridge.migrate.writes import atomic_write

            target = os.path.join(os.path.dirname(os.path.abspath(self.context.filename)), self.config_rel)
            config, prov = dict(analysis.config), dict(analysis.provenance)
            for key, info in analysis.to_fill.items():
                config.setdefault(key, info["placeholder"])
                prov.setdefault(key, f"TO FILL: the script takes {info['flag']} from the command line")
            atomic_write(target, render_yaml(config, prov, os.path.basename(filename)).encode())
        return new

    def migrate(self, tree: cst.Module) -> cst.Module:
        """Run the codemod on *tree* without libcst's metadata passes (linear time on large files).
        Raises ``SkipFile`` when the file is refused, like ``transform_module``."""
        return self.transform_module_impl(tree)

    @staticmethod
    def _removed_names(prog: Program, analysis: Analysis) -> Counter:
        """How often each name occurs in the code the rewrite removes."""
        if analysis.block is not None:
            kind, index, removed = analysis.block
            body = MigratePPOLoopCommand._block_body(prog.module, kind)
            nodes = [body[i] for i in [index, *removed]]
            nodes += [prog.module.body[i] for i in analysis.removed_defs]
        else:
            nodes = [analysis.entry.node.body] + [prog.module.body[i] for i in analysis.removed_defs]
        return Counter(n.value for node in nodes for n in walk(node) if isinstance(n, cst.Name))

    def _rewrite_entry(self, tree: cst.Module, entry: cst.FunctionDef) -> cst.Module:
        new_def = self.leave_FunctionDef(entry, entry)
        drop = set(self.analysis.removed_defs)  # the definition holding the loop, when nothing else uses it
        return tree.with_changes(body=[new_def if st is entry else st for i, st in enumerate(tree.body)
                                       if i not in drop])

    # ------------------------------------------------------------------ rewrite
    @staticmethod
    def _block_body(module: cst.Module, kind: str) -> list:
        if kind == "module":
            return list(module.body)
        guard = next(s for s in module.body if isinstance(s, cst.If) and "__main__" in cst.Module([]).code_for_node(s.test))
        return list(guard.body.body)

    def _trainer_lines(self) -> list:
        load = cst.parse_statement(
            "config = load_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), "
            f"{json.dumps(self.config_rel)}))\n")
        if self.analysis.reward_todo:
            load = load.with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment("# " + self.analysis.reward_todo))])
        return [load, cst.parse_statement("MegatronTrainer(config).train()\n")]

    def _rewrite_block(self, tree: cst.Module, block: tuple) -> cst.Module:
        """Loop at module level or in the ``__main__`` block: keep definitions, imports, constants and
        what they need; the statement running the loop becomes the trainer call (under the guard)."""
        kind, index, removed = block
        if self.analysis.removed_defs:
            drop = set(self.analysis.removed_defs)
            if kind == "module":
                # indexes of the module body: the loop's definition joins the removed statements
                removed = sorted(set(removed) | drop)
            else:
                tree = tree.with_changes(body=[s for i, s in enumerate(tree.body) if i not in drop])
        body = self._block_body(tree, kind)
        out = []
        pending = None
        for i, stmt in enumerate(body):
            if i == index:
                lead = list(getattr(stmt, "leading_lines", ())) or (pending or [])
                if kind == "module":
                    new = cst.If(test=cst.parse_expression('__name__ == "__main__"'),
                                 body=cst.IndentedBlock(body=self._trainer_lines()), leading_lines=lead)
                    out.append(new)
                else:
                    lines = self._trainer_lines()
                    lines[0] = lines[0].with_changes(leading_lines=lead + list(lines[0].leading_lines))
                    out.extend(lines)
            elif i not in removed:
                if pending is not None and not stmt.leading_lines:
                    stmt = stmt.with_changes(leading_lines=pending)
                pending = None
                out.append(stmt)
                continue
            elif pending is None:
                # the blank lines / comments above a removed run stay with the next kept statement
                pending = list(getattr(stmt, "leading_lines", ()))
                continue
            else:
                continue
            pending = None
        if kind == "module":
            return tree.with_changes(body=out)
        new_body = []
        for s in tree.body:
            if isinstance(s, cst.If) and "__main__" in cst.Module([]).code_for_node(s.test):
                s = s.with_changes(body=s.body.with_changes(body=out))
            new_body.append(s)
        return tree.with_changes(body=new_body)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if self.analysis is None or self.analysis.entry is None or original_node is not self.analysis.entry.node:
            return updated_node
        body = original_node.body
        if not isinstance(body, cst.IndentedBlock):
            raise SkipFile("the training function has a one-line body")
        new_stmts: list = []
        stmts = list(body.body)
        if stmts and _is_docstring(stmts[0]):
            new_stmts.append(stmts[0])
        load = cst.parse_statement(
            "config = load_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), "
            f"{json.dumps(self.config_rel)}))\n"
        )
        if self.analysis.reward_todo:
            load = load.with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment("# " + self.analysis.reward_todo))])
        new_stmts.append(load)
        train = cst.parse_statement("MegatronTrainer(config).train()\n")
        handler_try = next((s for s in stmts if isinstance(s, cst.Try) and _catches_keyboard_interrupt(s)), None)
        if handler_try is not None:
            new_stmts.append(self._keep_try(handler_try, train))
        else:
            new_stmts.append(train)
        return updated_node.with_changes(body=body.with_changes(body=new_stmts))

    def _keep_try(self, node: cst.Try, train: cst.BaseStatement) -> cst.Try:
        module_names = set(self.prog.module_assigns) | set(self.prog.imports) | set(dir(builtins))
        handlers = []
        for h in node.handlers:
            if not _handler_is_keyboard_interrupt(h):
                continue
            loaded = {n.value for n in walk(h.body) if isinstance(n, cst.Name)}
            bound = {h.name.name.value} if h.name is not None and isinstance(h.name.name, cst.Name) else set()
            if loaded - module_names - bound:
                code = cst.Module([]).code_for_node(h.body).strip("\n").splitlines()
                comments = [cst.EmptyLine(comment=cst.Comment(
                    "# verl-bridge: MegatronTrainer saves checkpoints itself (trainer.save_every); the old handler was:"))]
                comments += [cst.EmptyLine(comment=cst.Comment("# " + line.strip())) for line in code if line.strip()]
                raise_stmt = cst.SimpleStatementLine(body=[cst.Raise()], leading_lines=comments)
                h = h.with_changes(body=cst.IndentedBlock(body=[raise_stmt]))
            handlers.append(h)
        return node.with_changes(body=cst.IndentedBlock(body=[train]), handlers=handlers, orelse=None,
                                 finalbody=None)


def _is_docstring(stmt) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


def _handler_is_keyboard_interrupt(h: cst.ExceptHandler) -> bool:
    return h.type is not None and "KeyboardInterrupt" in cst.Module([]).code_for_node(h.type)


def _catches_keyboard_interrupt(node: cst.Try) -> bool:
    return any(_handler_is_keyboard_interrupt(h) for h in node.handlers)


# ---------------------------------------------------------------------- imports
def _is_import_line(stmt) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(x, (cst.Import, cst.ImportFrom)) for x in stmt.body)


def _alias_local(alias) -> str:
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    return cst.Module([]).code_for_node(alias.name).split(".")[0]


def _edit_imports(tree: cst.Module, prog: Program, gone: Counter) -> cst.Module:
    """Drop top-level imports that only the removed code used, then add ``import os`` and
    ``from verl_bridge import MegatronTrainer, load_config`` after the leading import block."""
    total: Counter = Counter()
    for node in prog._order:
        if isinstance(node, cst.Name):
            total[node.value] += 1
    in_imports: Counter = Counter()
    for stmt in prog.module.body:
        if _is_import_line(stmt):
            for n in walk(stmt):
                if isinstance(n, cst.Name):
                    in_imports[n.value] += 1

    def unused(local: str) -> bool:
        return gone.get(local, 0) > 0 and total[local] - in_imports[local] - gone[local] <= 0

    body, carry = [], []
    for stmt in tree.body:
        if not _is_import_line(stmt):
            if carry:
                stmt = stmt.with_changes(leading_lines=carry + list(stmt.leading_lines))
                carry = []
            body.append(stmt)
            continue
        smalls = []
        for small in stmt.body:
            if isinstance(small, cst.ImportFrom) and (isinstance(small.names, cst.ImportStar) or (
                    small.module is not None and cst.Module([]).code_for_node(small.module) == "__future__")):
                smalls.append(small)
                continue
            names = [a for a in small.names if not unused(_alias_local(a))]
            if not names:
                continue
            if len(names) != len(small.names):
                names[-1] = names[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                small = small.with_changes(names=names)
            smalls.append(small)
        if smalls:
            if carry:
                stmt = stmt.with_changes(leading_lines=carry + list(stmt.leading_lines))
                carry = []
            body.append(stmt.with_changes(body=smalls))
        else:
            carry += [line for line in stmt.leading_lines if line.comment is not None]
    have_os, have = False, set()
    for st in body:
        if not _is_import_line(st):
            continue
        for x in st.body:
            if isinstance(x, cst.Import):
                have_os = have_os or any(cst.Module([]).code_for_node(a.name) == "os" and a.asname is None
                                         for a in x.names)
            elif (x.module is not None and not x.relative and not isinstance(x.names, cst.ImportStar)
                  and cst.Module([]).code_for_node(x.module) == "verl_bridge"):
                have |= {_alias_local(a) for a in x.names if a.asname is None}
    new = []
    if not have_os:
        new.append(cst.parse_statement("import os\n"))
    missing = [n for n in ("MegatronTrainer", "load_config") if n not in have]
    if missing:
        new.append(cst.parse_statement(f"from verl_bridge import {', '.join(missing)}\n"))
    if not new:
        return tree.with_changes(body=body)
    # after the last import of the leading block (a docstring first)
    at = i = 0
    if body and isinstance(body[0], cst.SimpleStatementLine) and len(body[0].body) == 1 and isinstance(
            body[0].body[0], cst.Expr) and isinstance(body[0].body[0].value, (cst.SimpleString, cst.ConcatenatedString)):
        at = i = 1
    while i < len(body) and _is_import_line(body[i]):
        i += 1
        at = i
    return tree.with_changes(body=body[:at] + new + body[at:])
