"""A UDP syslog sink on 127.0.0.1:514 for HAProxy's access log (Serve's default log target),
so a benchmark run on a bare host keeps HAProxy's per-request log:
``python -m benchmarks.gpu.syslog_sink FILE &``."""

import socket
import sys

sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind(("127.0.0.1", 514))
with open(sys.argv[1], "ab", buffering=0) as out:
    while True:
        data, _ = sock.recvfrom(65535)
        out.write(data.rstrip(b"\n") + b"\n")
