"""netlab -- test hosts in network namespaces, for cluster tests that cut
links and partition the cluster (the idea of shared/lab/netlab.sh, in the
test harness's own terms).

Lab(n) makes hosts 1..n: each a network namespace with one veth into a
bridge in the root namespace, addresses 10.79.T.i/24 (T random per lab).
The root namespace holds 10.79.T.254 on the bridge, so the test process
(its clients) reaches every host; nothing is routed anywhere else.
Partitions and cuts are nftables rules *inside* the hosts that drop
traffic between hosts (never to or from the test process): a host that is
cut off sees silence, not a reset, like a switch failure.

Needs root, iproute2 and nft (CI runs as root; scripts/setup.sh installs
them). Everything is removed by close() (and at exit).
"""
import atexit
import os
import random
import subprocess

_labs = []


def _run(*args, input_text=None):
    r = subprocess.run(list(args), input=input_text, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(args), r.stderr.strip()))
    return r.stdout


def _free_subnet():
    """A 10.79.T subnet no interface of the root namespace has: a lab left
    behind by a killed run (its bridge stays, down) must not take the
    routes of this one."""
    taken = _run("ip", "-o", "-4", "addr", "show")
    free = [t for t in range(1, 250) if " 10.79.%d." % t not in taken]
    if not free:
        raise AssertionError("every 10.79.T/24 is in use: remove stale qlb* bridges")
    return "10.79.%d" % random.choice(free)


class Lab:
    def __init__(self, n):
        if os.geteuid() != 0:
            raise AssertionError("network namespaces need root (CI runs as root)")
        self.tag = "%03d%02d" % (os.getpid() % 1000, random.randrange(100))
        self.subnet = _free_subnet()
        self.bridge = "qlb" + self.tag
        self.n = n
        self.hosts = []
        _labs.append(self)
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", "%s.254/24" % self.subnet, "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i in range(1, n + 1):
            ns, veth = self.ns(i), "qlv%s%d" % (self.tag, i)
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run("ip", "link", "set", veth, "master", self.bridge)
            _run("ip", "link", "set", veth, "up")
            self.exec(i, "ip", "addr", "add", "%s/24" % self.ip(i), "dev", "eth0")
            self.exec(i, "ip", "link", "set", "eth0", "up")
            self.exec(i, "ip", "link", "set", "lo", "up")
            _run("ip", "netns", "exec", ns, "nft", "-f", "-", input_text="""
table inet quaylab {
  set cut { type ipv4_addr; }
  set mute { type ipv4_addr; }
  chain out { type filter hook output priority 0; policy accept; ip daddr @cut drop; }
  chain in {
    type filter hook input priority 0; policy accept;
    ip saddr @cut drop;
    meta l4proto udp ip saddr @mute drop;
  }
}
""")
            self.hosts.append(i)

    def ns(self, i):
        return "qlh%s-%d" % (self.tag, i)

    def ip(self, i):
        return "%s.%d" % (self.subnet, i)

    def exec(self, i, *args):
        return _run("ip", "netns", "exec", self.ns(i), *args)

    def _cut(self, i, j, on):
        verb = "add" if on else "delete"
        try:
            self.exec(i, "nft", verb, "element", "inet", "quaylab", "cut",
                      "{ %s }" % self.ip(j))
        except RuntimeError:
            if on:
                raise  # deleting what is not there is fine

    def mute_udp(self, i, j, on):
        """Host i hears no UDP from host j (the brokers' heartbeats; their
        TCP, Raft and AMQP links, still flows), or again."""
        verb = "add" if on else "delete"
        self.exec(i, "nft", verb, "element", "inet", "quaylab", "mute", "{ %s }" % self.ip(j))

    def partition(self, *groups):
        """partition([1, 2], [3]): hosts in different groups cannot talk."""
        for g in groups:
            for h in groups:
                if g is h:
                    continue
                for i in g:
                    for j in h:
                        self._cut(i, j, True)

    def heal(self):
        for i in self.hosts:
            self.exec(i, "nft", "flush", "set", "inet", "quaylab", "cut")

    def close(self):
        for i in self.hosts:
            subprocess.run(["ip", "netns", "pids", self.ns(i)], capture_output=True)
            pids = subprocess.run(["ip", "netns", "pids", self.ns(i)], capture_output=True,
                                  text=True).stdout.split()
            for pid in pids:
                subprocess.run(["kill", "-9", pid], capture_output=True)
            subprocess.run(["ip", "netns", "del", self.ns(i)], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        self.hosts = []
        if self in _labs:
            _labs.remove(self)


def _close_all():
    for lab in list(_labs):
        lab.close()


atexit.register(_close_all)
