"""The benchmark harness: HAProxy 2.6 and routerd in front of the same backends, same load clients;
and (the artemis group) routerd's redirects against Artemis 2.40's own connection router.

Run it with `.venv/bin/python -m benchmarks.run` (see benchmarks/README.md). Layout:

    run.py       command line, the order of the measurements, the table and the JSON file
    configs.py   the generated HAProxy, Lua, routerd and mosquitto configurations (pure text)
    fleet.py     processes: ports, start and stop by PID, readiness, RSS
    callgrind.py the instructions group: a process under valgrind's callgrind, its dumps, the
                 instructions per connection
    clients.py   the C load client and echo server (compiled at run time), iperf3, MQTT, CORE and
                 AMQP probes
    artemis.py   the artemis group's processes: Artemis brokers, routerd beside them, the Java
                 client of java/FirstSession.java
    decision.py  routing decision time, in process
    report.py    figures, ratios, the table and the JSON document
    studies/     studies run by hand (`python -m benchmarks.studies.NAME`), one file each; they use
                 the harness's parts, the harness never imports them

Everything listens and connects on 127.0.0.0/8 only. Nothing here is imported by the router.
"""
