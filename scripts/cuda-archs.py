#!/usr/bin/env python3
"""Lists the GPU code embedded in an ELF file (a library or program built with nvcc).

Prints one line per embedded image, "elf sm_90" (compiled machine code) or "ptx compute_90"
(PTX that the driver can JIT for newer GPUs), read from the .nv_fatbin section. It does
what `cuobjdump --list-elf --list-ptx` does, for machines whose CUDA toolkit lacks cuobjdump.

    scripts/cuda-archs.py build/src/libtutti.so [--expect elf:sm_90 --expect ptx:compute_90]

With --expect, exits 1 unless every expected image is present.
"""
import argparse
import struct
import subprocess
import sys
import tempfile

FATBIN_MAGIC = 0xBA55ED50
KIND = {1: "ptx", 2: "elf"}


def fatbin_section(path):
    with tempfile.NamedTemporaryFile() as out:
        subprocess.run(["objcopy", "-O", "binary", "--only-section=.nv_fatbin", path, out.name], check=True)
        return open(out.name, "rb").read()


def images(blob):
    pos = 0
    while pos + 16 <= len(blob):
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", blob, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # sections are 8-byte aligned; skip padding between fat binaries
            continue
        entry = pos + header_size
        end = entry + fat_size
        while entry + 32 <= end:
            kind, _unk, entry_header, payload = struct.unpack_from("<HHIQ", blob, entry)
            arch = struct.unpack_from("<I", blob, entry + 28)[0]
            yield KIND.get(kind, "kind%d" % kind), arch
            entry += entry_header + payload
        pos = end


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file")
    parser.add_argument("--expect", action="append", default=[], help="kind:name, e.g. elf:sm_90")
    args = parser.parse_args()
    found = set()
    for kind, arch in images(fatbin_section(args.file)):
        name = ("sm_%d" if kind == "elf" else "compute_%d") % arch
        found.add("%s:%s" % (kind, name))
    for item in sorted(found):
        print(item.replace(":", " "))
    missing = [e for e in args.expect if e not in found]
    if missing:
        print("missing: " + ", ".join(missing), file=sys.stderr)
        return 1
    if not found:
        print("no GPU code found in " + args.file, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
