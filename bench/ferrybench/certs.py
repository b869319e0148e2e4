"""Throw-away certificates: one self-signed localhost certificate for the
TLS suites, a CA and a certificate it signs for the mesh suite's regions."""

import os
import subprocess

# A new ECDSA P-256 key, unencrypted (openssl req).
EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def openssl(*args):
    subprocess.run(["openssl", *(str(a) for a in args)], check=True, capture_output=True)


def make_cert(tmp):
    certdir = tmp / "certs"
    certdir.mkdir()
    openssl("req", "-x509", *EC_KEY, "-days", "30", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
            "-addext", "basicConstraints=critical,CA:FALSE", "-addext", "extendedKeyUsage=serverAuth",
            "-keyout", certdir / "localhost.key", "-out", certdir / "localhost.crt")
    return certdir


def make_region_certs(tmp):
    """The mesh suite's certificates: a throw-away CA (ca.pem) and a
    certificate for localhost it signs, shared by the region's nodes, which
    verify each other against the CA (SSL_CERT_FILE) as a real region's
    nodes do against the system's roots; plus the region's mesh key."""
    d = tmp / "region-certs"
    d.mkdir()
    openssl("req", "-x509", *EC_KEY, "-days", "30", "-subj", "/CN=ferry bench CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
            "-keyout", d / "ca.key", "-out", d / "ca.pem")
    openssl("req", "-new", *EC_KEY, "-subj", "/CN=localhost", "-keyout", d / "localhost.key", "-out", d / "localhost.csr")
    (d / "leaf.ext").write_text("subjectAltName=DNS:localhost\nbasicConstraints=critical,CA:FALSE\n"
                                "extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n")
    openssl("x509", "-req", "-in", d / "localhost.csr", "-CA", d / "ca.pem", "-CAkey", d / "ca.key",
            "-set_serial", "0x" + os.urandom(8).hex(), "-days", "30", "-extfile", d / "leaf.ext",
            "-out", d / "localhost.crt")
    (d / "mesh.key").write_text(os.urandom(32).hex() + "\n")
    (d / "mesh.key").chmod(0o600)
    return d
