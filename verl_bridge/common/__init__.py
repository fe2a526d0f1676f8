"""What every layer stands on: the batch types, the trainer's state and roles, precision helpers and
the user-hook calling conventions, the console lines and MoE routing replay.

``rollout/``, ``placement/`` and ``checkpoint/`` import these from here, never from ``runtime/``
or ``bridge/`` above them (``tests/test_structure.py`` checks it). The old paths
(``verl_bridge.runtime.batch``, ``.state``, ``.roles``, ``verl_bridge.bridge.precision``,
``.hooks``) still import, as re-exports.
"""
