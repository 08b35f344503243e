"""Round trip of a TCP connection between two testbed hosts (tests/testbed/testbed_test.sh).

  tcp_rtt.py serve PORT          echo what arrives (one connection, 20 s to accept)
  tcp_rtt.py ping ADDR PORT N    N one-byte round trips; prints their median in milliseconds
"""
import socket
import sys
import time

if sys.argv[1] == "serve":
    s = socket.create_server(("0.0.0.0", int(sys.argv[2])))
    s.settimeout(20)
    c, _ = s.accept()
    c.settimeout(20)
    while True:
        d = c.recv(64)
        if not d:
            break
        c.sendall(d)
else:
    c = socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=10)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for _ in range(int(sys.argv[4])):
        t = time.perf_counter()
        c.sendall(b"x")
        if not c.recv(64):
            sys.exit("the echo closed")
        rtts.append((time.perf_counter() - t) * 1000)
    c.close()
    rtts.sort()
    print("%.2f" % rtts[len(rtts) // 2])
