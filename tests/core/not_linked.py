"""Fails if the shared library argv[1] lists a library whose name starts with argv[2] among the
ones it needs at load time (its ELF dynamic section's NEEDED entries, read with readelf)."""
import subprocess
import sys

library, prefix = sys.argv[1], sys.argv[2]
dynamic = subprocess.run(["readelf", "-d", library], capture_output=True, text=True, check=True).stdout
needed = [line.split("[", 1)[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line]
if not needed:
    sys.exit(f"{library}: no NEEDED entries read; readelf said:\n{dynamic}")
linked = [n for n in needed if n.startswith(prefix)]
if linked:
    sys.exit(f"{library} needs {', '.join(linked)} at load time; it must load it on first use")
print(f"{library} needs {len(needed)} libraries, none starting with {prefix}: {', '.join(needed)}")
