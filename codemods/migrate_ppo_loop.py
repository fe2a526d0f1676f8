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
import json
import builtins
import os
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
                 source_dir: Optional[str] = None) -> None:
        super().__init__(context)
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
        source_dir = self.source_dir
        if source_dir is None and self.context.filename:
            source_dir = os.path.dirname(os.path.abspath(self.context.filename))
        prog = Program(tree, os.path.basename(filename), wrapper=self.context.wrapper, source_dir=source_dir)
        analysis = analyze(prog, module_name)
        if analysis.status == "migrate" and not module_name.isidentifier():
            analysis.refuse(f"the file name {os.path.basename(filename)!r} is not an importable module name; "
                            "rename it (for example to train_ppo.py) so the config can reference its hooks")
        self.analysis = analysis
        self.prog = prog
        if analysis.status == "refuse":
            raise SkipFile("refused: " + "; ".join(analysis.reasons))
        if analysis.status == "unchanged":
            return tree
        self.config_rel = self.config_path or f"{module_name}.yaml"
        self._schedule_imports(prog, analysis)
        if analysis.block is not None:
            new = self._rewrite_block(tree, analysis.block)
        else:
            new = tree.visit(self)
        if self.write_config and self.context.filename:
            from verl_bridge.migrate.yamlout import render_yaml
            from verl_bridge.migrate.writes import atomic_write

            target = os.path.join(os.path.dirname(os.path.abspath(self.context.filename)), self.config_rel)
            atomic_write(target, render_yaml(analysis.config, analysis.provenance, os.path.basename(filename)).encode())
        return new

    def _schedule_imports(self, prog: Program, analysis: Analysis) -> None:
        self.add_needed_import("os")
        self.add_needed_import("verl_bridge", "MegatronTrainer")
        self.add_needed_import("verl_bridge", "load_config")
        if analysis.block is not None:
            kind, index, removed = analysis.block
            body = self._block_body(prog.module, kind)
            used = {n.value for i in [index, *removed] for n in walk(body[i]) if isinstance(n, cst.Name)}
            for i in analysis.removed_defs:
                used |= {n.value for n in walk(prog.module.body[i]) if isinstance(n, cst.Name)}
        else:
            used = {n.value for n in walk(analysis.entry.node.body) if isinstance(n, cst.Name)}
        for stmt in prog.module.body:
            if not isinstance(stmt, cst.SimpleStatementLine):
                continue
            for small in stmt.body:
                if isinstance(small, cst.Import):
                    for alias in small.names:
                        local = alias.asname.name.value if alias.asname else cst.Module([]).code_for_node(alias.name).split(".")[0]
                        if local in used:
                            full = cst.Module([]).code_for_node(alias.name)
                            self.remove_unused_import(full, None, alias.asname.name.value if alias.asname else None)
                elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar) and small.module is not None and not small.relative:
                    mod = cst.Module([]).code_for_node(small.module)
                    if mod == "__future__":
                        continue
                    for alias in small.names:
                        name = cst.Module([]).code_for_node(alias.name)
                        local = alias.asname.name.value if alias.asname else name
                        if local in used:
                            self.remove_unused_import(mod, name, alias.asname.name.value if alias.asname else None)

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
        for i, stmt in enumerate(body):
            if i == index:
                lead = list(getattr(stmt, "leading_lines", ()))
                if kind == "module":
                    new = cst.If(test=cst.parse_expression('__name__ == "__main__"'),
                                 body=cst.IndentedBlock(body=self._trainer_lines()), leading_lines=lead)
                    out.append(new)
                else:
                    lines = self._trainer_lines()
                    lines[0] = lines[0].with_changes(leading_lines=lead + list(lines[0].leading_lines))
                    out.extend(lines)
            elif i not in removed:
                out.append(stmt)
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
