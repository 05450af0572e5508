"""Rebuild the machine code of dt-symm-mem's non-temporal copy and check it.

    python tools/build_nt_copy.py [--write]

Compiles packages/dt-symm-mem/native/nt_copy_bulk.c with gcc (-O2, SSE2 only, no
unwind tables or CET padding), extracts the .text section, and compares it with the
bytes embedded in dt_symm_mem/ntcopy.py; --write replaces them. Needs gcc and objcopy
on an x86-64 host; nothing at install or run time does.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "packages/dt-symm-mem/native/nt_copy_bulk.c"
MODULE = ROOT / "packages/dt-symm-mem/src/dt_symm_mem/ntcopy.py"
PATTERN = re.compile(r'(_BULK_X86_64 = bytes\.fromhex\(\n)((?:\s+"[0-9a-f]+"\n)+)(\s*\))')


def compile_bulk() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        obj, binary = Path(tmp) / "bulk.o", Path(tmp) / "bulk.bin"
        flags = ["-O2", "-mno-avx", "-fno-asynchronous-unwind-tables", "-fcf-protection=none"]
        subprocess.run(["gcc", *flags, "-c", str(SOURCE), "-o", str(obj)], check=True)
        relocations = subprocess.run(
            ["readelf", "-r", str(obj)], check=True, capture_output=True, text=True
        ).stdout
        if "R_X86_64" in relocations:
            raise SystemExit("the compiled loop has relocations; it must call nothing")
        extract = ["objcopy", "-O", "binary", "-j", ".text", str(obj), str(binary)]
        subprocess.run(extract, check=True)
        return binary.read_bytes()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update the embedded bytes")
    args = parser.parse_args()
    code = compile_bulk().hex()
    text = MODULE.read_text()
    match = PATTERN.search(text)
    if match is None:
        raise SystemExit(f"no _BULK_X86_64 block in {MODULE}")
    embedded = "".join(re.findall(r'"([0-9a-f]+)"', match.group(2)))
    if embedded == code:
        print(f"embedded bytes match the compiled source ({len(code) // 2} bytes)")
        return 0
    if not args.write:
        print(f"embedded bytes differ from the compiled source:\n{embedded}\n{code}")
        return 1
    lines = "".join(f'    "{code[i : i + 64]}"\n' for i in range(0, len(code), 64))
    MODULE.write_text(text[: match.start(2)] + lines + text[match.end(2) :])
    print(f"wrote {len(code) // 2} bytes into {MODULE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
