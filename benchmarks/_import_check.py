import importlib, pkgutil, verl_bridge
bad = []
for m in pkgutil.walk_packages(verl_bridge.__path__, "verl_bridge."):
    if any(x in m.name for x in ("vllm",)):
        continue
    try:
        importlib.import_module(m.name)
    except Exception as e:
        bad.append((m.name, f"{type(e).__name__}: {e}"))
print("IMPORT-CHECK", len(bad), "failures"); [print("  ", b) for b in bad]
