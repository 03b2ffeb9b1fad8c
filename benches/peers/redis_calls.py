#!/usr/bin/env python3
"""The Redis store's Lua library, called directly: the server's cost per fresh claim, settle
and replay, without the client or the harness in the way.

Loads a library file (default: the store's own script.lua) under a name of its own into the
Redis on 127.0.0.1:PORT, then pipes N fresh claims of distinct keys, their N settles, and the
same N claims again (replays) through `redis-cli --pipe`, and prints the server's time per
call of each kind (`INFO commandstats`, reset before each kind). With --callgrind PID (a
redis-server running under `valgrind --tool=callgrind`) it prints thousands of instructions
per call instead (counts zeroed before each kind and dumped after it): steady to a few per
cent on a loaded machine, where times are not. The server's data is flushed first: point it
at a private server only.

    redis-server --port 7777 --save '' --appendonly no &
    benches/peers/redis_calls.py --port 7777 --calls 10000 --rounds 3
    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg/out.%p \\
        redis-server --port 7778 --save '' --appendonly no &
    benches/peers/redis_calls.py --port 7778 --calls 2000 --callgrind <its pid> --out /tmp/cg

To price one change, edit a copy of script.lua and pass it with --lua; --keys 11 names the
two release keys as well (what the store did before it named them only for
`release_unsettled`).
"""
import argparse
import glob
import hashlib
import os
import re
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, '..', '..', 'idem-runtime', 'src', 'store', 'redis', 'script.lua')
PREFIX = 'idem-bench:'
INDEXES = ['s:running', 's:completed', 's:failed', 's:pending', 's:unknown', 's:escalated',
           'leases', 'expiry']
NOW = 1796092353026
RESULTS_MS, TOMBSTONES_MS, LEASE_MS = 86_400_000, 7 * 86_400_000, 30_000
FINGERPRINT = 'a' * 64
OPERATION = ('{"scope":{"tool":"charge","account":"acme"},'
             '"args":{"customer":"acme","amount_cents":4900,"currency":"usd"}}')
PAYLOAD = '{"charge_id":"ch_123","status":"ok"}'
ATTEMPTS = ('[{"attempt":1,"started_at":%d,"finished_at":%d,"class":"completed",'
            '"kind":"returned","message":null}]' % (NOW, NOW + 1))


def resp(args):
    out = [b'*%d\r\n' % len(args)]
    for a in args:
        a = a.encode() if isinstance(a, str) else a
        out.append(b'$%d\r\n%s\r\n' % (len(a), a))
    return b''.join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--port', required=True)
    ap.add_argument('--lua', default=SCRIPT)
    ap.add_argument('--calls', type=int, default=10000)
    ap.add_argument('--rounds', type=int, default=1)
    ap.add_argument('--keys', type=int, choices=(9, 11), default=9)
    ap.add_argument('--callgrind', metavar='PID')
    ap.add_argument('--out', help="with --callgrind: the directory of its --callgrind-out-file")
    a = ap.parse_args()
    if a.callgrind and not a.out:
        ap.error('--callgrind needs --out, the directory callgrind dumps into')

    def cli(*args, data=None):
        return subprocess.run(['redis-cli', '-p', a.port, *args], input=data,
                              capture_output=True, check=True).stdout

    code = open(a.lua).read()
    name = 'idem_bench_' + hashlib.sha256(code.encode()).hexdigest()[:12]
    loaded = cli('-x', 'FUNCTION', 'LOAD', 'REPLACE', data=code.replace('IDEM_LIBRARY', name).encode())
    if name.encode() not in loaded:
        raise SystemExit('FUNCTION LOAD failed: ' + loaded.decode(errors='replace'))

    def call(key, *argv):
        keys = [PREFIX + 'r:' + key] + [PREFIX + i for i in INDEXES]
        if a.keys == 11:
            keys += [PREFIX + 'rel:' + key, PREFIX + 'releases']
        return resp(['FCALL', name, str(len(keys)), *keys, str(NOW), str(RESULTS_MS),
                     str(TOMBSTONES_MS), PREFIX + 'r:', *argv])

    def measure(commands):
        if a.callgrind:
            subprocess.run(['callgrind_control', '-z', a.callgrind], capture_output=True, check=True)
        else:
            cli('CONFIG', 'RESETSTAT')
        piped = subprocess.run(['redis-cli', '-p', a.port, '--pipe'], input=b''.join(commands),
                               capture_output=True)
        if piped.returncode != 0 or b'errors: 0,' not in piped.stdout:
            raise SystemExit('a call failed: ' + piped.stdout.decode(errors='replace'))
        if a.callgrind:
            subprocess.run(['callgrind_control', '-d', a.callgrind], capture_output=True, check=True)
            dump = max(glob.glob(os.path.join(a.out, '*')), key=os.path.getmtime)
            total = next(int(l.split()[1]) for l in open(dump)
                         if l.startswith(('summary:', 'totals:')))
            return '%.1fk instructions' % (total / len(commands) / 1000)
        stats = cli('INFO', 'commandstats').decode()
        return re.search(r'cmdstat_fcall:.*usec_per_call=([\d.]+)', stats).group(1) + ' µs'

    for r in range(a.rounds):
        cli('FLUSHALL')
        keys = ['charge:%064x' % (r * 10**9 + i) for i in range(a.calls)]
        tokens = [hashlib.md5(k.encode()).hexdigest() for k in keys]
        claims = [call(k, 'claim', k, FINGERPRINT, 'charge', t, str(LEASE_MS), '+' + OPERATION)
                  for k, t in zip(keys, tokens)]
        settles = [call(k, 'settle', t, 'completed', '+' + PAYLOAD, '-', '-', ATTEMPTS, '[]')
                   for k, t in zip(keys, tokens)]
        print('round %d: claim %s, settle %s, replay %s' % (
            r + 1, measure(claims), measure(settles), measure(claims)))


if __name__ == '__main__':
    main()
