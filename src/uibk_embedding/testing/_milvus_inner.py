"""Runs inside the private network namespace of
:class:`~uibk_embedding.testing.milvus_server.LocalMilvusServer`:
brings the namespace's loopback up, starts ``milvus run standalone`` (the ``milvus`` package),
relays a Unix socket to it, writes ``ready`` and kills the server when its parent dies.

Usage (by LocalMilvusServer only):
``python -m uibk_embedding.testing._milvus_inner BASE SOCK ISOLATED PARENT_PID``
"""
# ruff: noqa: E401, E702, I001

if __name__ == "__main__":
    import fcntl, os, socket, struct, sys, threading, time
    parent = int(sys.argv[4])  # given: a parent that died before this started is seen too
    from milvus import MilvusServer, MilvusServerConfig
    base, sock_path, isolated = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    if os.getppid() != parent:  # the process that started this is gone: start nothing
        import shutil
        shutil.rmtree(base, ignore_errors=True)
        sys.exit(0)
    if isolated:  # a fresh network namespace: bring its loopback up (SIOCGIFFLAGS / SIOCSIFFLAGS)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH22x", b"lo", 0))[:18])[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sH22x", b"lo", flags | 1))
    cfg = MilvusServerConfig(data_dir=os.path.join(base, "data"))
    # Strong reads wait for the server's next time tick: 20 ms instead of the default 200 ms makes
    # each test read ~0.2 s faster (the Milvus-standalone tests ran 2-4x faster), same semantics
    cfg.set("proxy.timeTickInterval", 20)
    # Milvus's components hold 30 s etcd leases and exit when one lapses: a machine that stalls
    # for longer loses the server (a SIGSTOP of 40 s kills one here; the kernel logged a 34 s
    # lockup minutes before both test servers of one CI run died). Test leases last 10 minutes.
    cfg.set("common.session.ttl", 600)
    server = MilvusServer(cfg)
    server.start()
    port, pid = server.listen_port, server.server_proc.pid
    from uibk_embedding.testing.milvus_server import pump
    def serve():
        ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        ls.bind(sock_path); ls.listen(64)
        while True:
            c, _ = ls.accept()
            try:
                t = socket.create_connection(("127.0.0.1", port))
            except OSError:  # refused once (the server busy or restarting): drop this client only
                c.close()
                continue
            threading.Thread(target=pump, args=(c, t), daemon=True).start()
            threading.Thread(target=pump, args=(t, c), daemon=True).start()
    threading.Thread(target=serve, daemon=True).start()
    tmp = os.path.join(base, "ready.tmp")
    with open(tmp, "w") as f:
        f.write(f"{pid} {port}")
    os.replace(tmp, os.path.join(base, "ready"))
    while os.getppid() == parent and server.server_proc.poll() is None:
        time.sleep(0.5)
    os.kill(pid, 9)  # the parent died (or the server did): never leave milvus behind
    if os.getppid() != parent:  # nobody will call stop(): remove the data directory ourselves
        import shutil
        time.sleep(1)
        shutil.rmtree(base, ignore_errors=True)
