"""Load generation for `radixmesh bench`: workloads, clients, the load loop, report, SLOs, plots.

    scripts = iter_scripts(WorkloadConfig(name="shared-prefix", seed=1))
    client = make_client("openai", "http://127.0.0.1:8080", "tiny-llama")
    before = await scraper.snapshot()
    run = await run_load(scripts, client, LoadConfig(concurrency=8, num_requests=64))
    report = build_report(run, before, await scraper.snapshot())

Every module here is plain asyncio and data; none imports a service's code.
"""
