"""Docker health check for `cslm serve`: a HELLO handshake (docs/cslm.md, protocol v1).

Exit status 0 when the server on 127.0.0.1:$CSLM_PORT answers the handshake, 1 otherwise.
"""

import os
import socket
import struct
import sys


def main() -> int:
    port = int(os.environ.get("CSLM_PORT", "5107"))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            payload = b"CSLM" + struct.pack("<HH", 1, 0)
            s.sendall(struct.pack("<IBBHI", len(payload), 0x01, 0, 0, 1) + payload)
            head = b""
            while len(head) < 12:
                chunk = s.recv(12 - len(head))
                if not chunk:
                    raise ConnectionError("closed during handshake")
                head += chunk
            length, ftype, _, _, rid = struct.unpack("<IBBHI", head)
            if ftype != 0x81 or rid != 1:
                raise ConnectionError(f"unexpected reply type {ftype:#x}")
    except (OSError, ConnectionError) as e:
        print(f"cslm server on port {port}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
