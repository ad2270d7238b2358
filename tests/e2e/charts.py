"""The detail page's charts as the browser tests and bench/log_history.py time them."""

# Fifteen minutes of points at one a second (the charts' window at its most), then one more
# a frame for 60 frames; resolves with the redraws' mean milliseconds over those frames (all
# seven charts each), the page's longest redraw, and the points held.
FULL_WINDOW_REDRAW = """() => new Promise((done) => {
    const base = Date.now() / 1000 + 60;
    const point = (i) => ({t: base + i, throughput: 300 + i % 17, input_throughput: 50,
        accept_len: 4.8, accept_rate: 0.7, running: 2, queued: 0, kv_usage: 0.1,
        cuda_graph: 1, itl_p50: 0.005, itl_p99: 0.02, ttft_p50: 0.03, ttft_p99: 0.1, gpus: []});
    for (let i = 0; i < 900; i++) ApplianceCharts.push(point(i));
    const before = ApplianceCharts.stats();
    let i = 900;
    const tick = () => {
        ApplianceCharts.push(point(i++));
        if (i < 960) { requestAnimationFrame(tick); return; }
        requestAnimationFrame(() => {
            const after = ApplianceCharts.stats();
            done({mean: (after.drawMs - before.drawMs) / (after.draws - before.draws),
                  max: after.maxDrawMs, points: after.points});
        });
    };
    requestAnimationFrame(tick);
})"""
