#!/usr/bin/env python3
"""A delay line for network-namespace tests: this kernel has no netem.

    link-delay.py IFNAME DELAY_MS [MAX_PACKETS]

Creates the TUN device IFNAME (no packet information header), and from then
on every IP packet the kernel routes into it comes back out of it DELAY_MS
milliseconds later, unchanged and in the same order, as if received on
IFNAME. Used in a router namespace whose policy routing sends the packets to
be delayed (by the interface they arrived on) into the TUN device, and the
packets coming back out of it through the main table, so that one process
delays TCP and UDP alike, for every case the same. MAX_PACKETS (default
20000) bounds the packets in flight; beyond it packets are dropped and
counted, as a full router queue would. Prints "ready" once the device
exists; on SIGTERM or SIGINT prints one line of counts and exits.

Loss is not this program's business: nftables `numgen random` rules drop
packets where they enter the router.
"""

import collections
import fcntl
import os
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__.strip().splitlines()[2].strip())
    name = sys.argv[1].encode()
    delay = float(sys.argv[2]) / 1000.0
    limit = int(sys.argv[3]) if len(sys.argv) == 4 else 20000
    if len(name) > 15 or delay < 0 or limit < 1:
        sys.exit("IFNAME at most 15 bytes, DELAY_MS >= 0, MAX_PACKETS >= 1")

    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name, IFF_TUN | IFF_NO_PI))

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    print("ready", flush=True)

    # A constant delay keeps the order: a FIFO of (due time, packet).
    line = collections.deque()
    passed = dropped = 0
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while not stop:
        timeout = None
        if line:
            timeout = max(0, int((line[0][0] - time.monotonic()) * 1000) + 1)
        try:
            poller.poll(timeout if timeout is not None else 100)
        except InterruptedError:
            continue
        now = time.monotonic()
        # Bounded per turn so that due packets are never starved.
        for _ in range(256):
            try:
                pkt = os.read(fd, 65535)
            except BlockingIOError:
                break
            if len(line) >= limit:
                dropped += 1
            else:
                line.append((now + delay, pkt))
        now = time.monotonic()
        while line and line[0][0] <= now:
            _, pkt = line.popleft()
            try:
                os.write(fd, pkt)
                passed += 1
            except (BlockingIOError, OSError):
                dropped += 1
    print(f"passed {passed} dropped {dropped} in_flight {len(line)}", flush=True)


if __name__ == "__main__":
    main()
