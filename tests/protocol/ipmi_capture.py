"""Datagrams between ipmitool 1.8.19 and OpenIPMI 2.0.33's ipmi_sim: a real lanplus handshake.

Captured through a UDP relay on loopback: `ipmitool -I lanplus -U admin -P s3cret -C 3 sol
activate` against ipmi_sim with user "admin", password "s3cret" and the GUID a123456789abcdef
a123456789abcdef. C lines are ipmitool's, B lines the BMC's, in order: Get Channel
Authentication Capabilities, Open Session, RAKP 1-4, then encrypted and signed IPMI
commands (ipmitool's Set Session Privilege, its SOL activation and what followed).
"""

from __future__ import annotations

__all__ = ["CAPTURE", "PASSWORD", "USERNAME"]

USERNAME = b"admin"
PASSWORD = b"s3cret"

CAPTURE = (
    ("C", bytes.fromhex("0600ff07000000000000000000092018c88100388e04b5")),
    ("B", bytes.fromhex("0600ff0700000000000000000010811c6320003800019704030000000009")),
    (
        "C",
        bytes.fromhex(
            "0600ff0706100000000000000000200000000000a4a3a2a0000000080100000001000008010000000200000801000000"
        ),
    ),
    (
        "B",
        bytes.fromhex(
            "0600ff0706110000000000000000240000000000a4a3a2a082030000000000080100000001000008010000000200000801000000"
        ),
    ),
    (
        "C",
        bytes.fromhex(
            "0600ff070612000000000000000021000000000082030000bce07fa7e84b8057adad3b08babb2d7e1400000561646d696e"
        ),
    ),
    (
        "B",
        bytes.fromhex(
            "0600ff07061300000000000000003c0000000000a4a3a2a0f7c04d938095bfa641141ea931cf641ca123456789abcdefa123456789abcdef33aa3875e197c61c9f4d4d8e356d30714351bcfa"
        ),
    ),
    (
        "C",
        bytes.fromhex(
            "0600ff07061400000000000000001c000000000082030000681bf5d40dcaf489a4be0b680c4f493f79612a2b"
        ),
    ),
    (
        "B",
        bytes.fromhex("0600ff0706150000000000000000140000000000a4a3a2a01a1c6b0e64a9bc60fa38325e"),
    ),
    (
        "C",
        bytes.fromhex(
            "0600ff0706c082030000030000002000044e7af54313d8f5f5d29978ddccdb6dce2d0605d355be70646b37659c0cdb6effff0207215533652a0af4e53053c46d"
        ),
    ),
    (
        "B",
        bytes.fromhex(
            "0600ff0706c0a4a3a2a0010000002000ffb7204f305211bff5af369a6b1a9b36172becf53d165a9eaa4569421ea10f8cffff0207027c0547d38cf8d00097df19"
        ),
    ),
    (
        "C",
        bytes.fromhex(
            "0600ff0706c082030000040000002000c20ca6e519339763f03e8e2071a5ff0db6c9d817618ac6da1199c0669d73c112ffff020762123ba231d8ed1299ccf147"
        ),
    ),
    (
        "B",
        bytes.fromhex(
            "0600ff0706c0a4a3a2a00200000020000c65997c05312f5580781f46b35ddd557ac53eac6f8c8773f006f6e3bfe01cd1ffff02076ce92d94f5f158a0e1f97517"
        ),
    ),
    (
        "C",
        bytes.fromhex(
            "0600ff0706c0820300000500000020004d00af2f313734e4cc491f5f1558f3f394f9c76eedbf4716317ccbc4809a7ac9ffff0207afdf489433af5f2b31fff14e"
        ),
    ),
    (
        "B",
        bytes.fromhex(
            "0600ff0706c0a4a3a2a00300000030007a76ee3aec06b1e73be75c180ad1afe8a494c202caaebc2c8ac7c1f613e9674193e631b762b2c1fd17fa000afb2e674dffff02079173433e0ef7976c9ab32558"
        ),
    ),
    (
        "C",
        bytes.fromhex(
            "0600ff0706c0820300000600000020009a57656e3f03a51b5eaea4ce397cf649ebe99d22f9ba3574a4ef46ec78e348b2ffff02074ea9a02aafba03150984f3b2"
        ),
    ),
    (
        "B",
        bytes.fromhex(
            "0600ff0706c0a4a3a2a00400000020008dcd5344bf79e143265b4fe1d7f5ee672366e38c84fa8c212ac339e984f6f438ffff02075176040abf05b252485f6a20"
        ),
    ),
    (
        "C",
        bytes.fromhex(
            "0600ff0706c0820300000700000020009bbe317975e8d81d3c0ff99f48afc40839847f3935b447bfe439c8719bff49c9ffff0207a0502bce65f99a5fdf758afe"
        ),
    ),
    (
        "B",
        bytes.fromhex(
            "0600ff0706c0a4a3a2a0050000002000a0a917a4691046ee2f14070d16a2e0c5e2dd655bf17a477107582253b5db9cfeffff0207ecb4b45885887fbc33b74845"
        ),
    ),
    (
        "C",
        bytes.fromhex(
            "0600ff0706c082030000080000002000d4b4bfe5b0d6f27088b7852bee930d06024cea3f5568061b67f58ea00f41bf2effff020765c6caa81f9bd83f6b9bf171"
        ),
    ),
    (
        "B",
        bytes.fromhex(
            "0600ff0706c0a4a3a2a0060000003000f246679bbdeb126c38e63fe8fe757973c98953a6ef0a44406a804e65b34e58118feba68c22e17e8f2ea9c8e5d7197591ffff020790f022afa831dbe018363030"
        ),
    ),
    (
        "C",
        bytes.fromhex(
            "0600ff0706c0820300000900000020002f98b3342db88724a3c53cc8d7c64ebd4ab4d2ad58d5009ac771503b8b96beecffff0207e8e14060fad6d7a0d4a59ede"
        ),
    ),
    (
        "B",
        bytes.fromhex(
            "0600ff0706c0a4a3a2a007000000200061ede9657b1dd9c281fea1126274d106a023ec11cda24f201f555e5c5d822729ffff020706e37e5e6201b3704d85a4cc"
        ),
    ),
)
