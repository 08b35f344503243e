#!/usr/bin/python3
"""Measures a TCP transfer between two testbed hosts: `serve PORT` on one, `send ADDR PORT BYTES` on the other.
The sender prints the goodput in Mbit/s (bytes over the time from connect to the receiver's acknowledgement)."""
import socket
import sys
import time


def serve(port):
    with socket.create_server(("0.0.0.0", port)) as srv:
        srv.settimeout(60)
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(60)
            total = 0
            while True:
                b = conn.recv(1 << 16)
                if not b:
                    break
                total += len(b)
            conn.sendall(str(total).encode())
    print(total)


def send(addr, port, nbytes):
    deadline = time.time() + 10
    while True:  # the server may still be starting
        try:
            s = socket.create_connection((addr, port), timeout=60)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)
    t0 = time.time()
    chunk = b"x" * (1 << 16)
    left = nbytes
    with s:
        while left > 0:
            n = min(left, len(chunk))
            s.sendall(chunk[:n])
            left -= n
        s.shutdown(socket.SHUT_WR)
        got = int(s.recv(64).decode() or 0)
    dt = time.time() - t0
    if got != nbytes:
        sys.exit(f"receiver got {got} of {nbytes} bytes")
    print(f"{nbytes * 8 / dt / 1e6:.2f}")


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
