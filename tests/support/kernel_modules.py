"""Tiny kernel module files for the fast tests: an ELF64 relocatable object holding only a
`.modinfo` section, which kmod's `modinfo` and `depmod` read as they read a real `.ko`
(name, vermagic, depends, license), optionally followed by a module signature block in the
kernel's layout, so an install can be checked without compiling a driver."""

from __future__ import annotations

import struct

MAGIC = b"~Module signature appended~\n"


def module_elf(
    name: str,
    vermagic: str,
    *,
    depends: str = "",
    version: str = "",
    signed: bool = False,
    license: str = "Dual MIT/GPL",  # the open modules'; the proprietary ones say "NVIDIA"
) -> bytes:
    fields = [f"license={license}", f"name={name}", f"vermagic={vermagic}", f"depends={depends}"]
    if version:
        fields.append(f"version={version}")
    modinfo = b"".join(field.encode() + b"\0" for field in fields)
    shstrtab = b"\0.modinfo\0.shstrtab\0"
    header_size = 64
    modinfo_offset = header_size
    shstrtab_offset = modinfo_offset + len(modinfo)
    section_offset = (shstrtab_offset + len(shstrtab) + 7) & ~7
    header = (
        b"\x7fELF"
        + bytes([2, 1, 1, 0])
        + bytes(8)
        + struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, section_offset, 0, 64, 0, 0, 64, 3, 2)
    )

    def section(name_offset: int, kind: int, flags: int, offset: int, size: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name_offset, kind, flags, 0, offset, size, 0, 0, 1, 0)

    sections = (
        bytes(64)
        + section(1, 1, 2, modinfo_offset, len(modinfo))  # .modinfo, PROGBITS, ALLOC
        + section(10, 3, 0, shstrtab_offset, len(shstrtab))  # .shstrtab, STRTAB
    )
    body = header + modinfo + shstrtab
    body += bytes(section_offset - len(body)) + sections
    if signed:
        body += _signature_block()
    return body


def _signature_block() -> bytes:
    # Signer, key id and signature, then struct module_signature: algo (1: RSA), hash
    # (4: sha256), id_type (1: X.509, read field by field), signer_len, key_id_len, pad[3],
    # sig_len (big-endian); then the magic. The signature bytes are not a real one: modinfo
    # shows who signed, the kernel would check it.
    signer, key_id, signature = b"gpuop test signing key", bytes(range(20)), bytes(32)
    trailer = struct.pack(">BBBBB3xI", 1, 4, 1, len(signer), len(key_id), len(signature))
    return signer + key_id + signature + trailer + MAGIC
