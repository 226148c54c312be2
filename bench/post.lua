-- wrk script: POST the bytes of $BENCH_BODY_FILE as application/json, tag each
-- request with X-Request-ID $BENCH_REQUEST_ID (the access log's request_id),
-- send Accept: $BENCH_ACCEPT when it is set (application/x-npz asks /trace for
-- npz), and print one machine-readable summary line when done.
-- If the body contains __N__, every request replaces it with a new number
-- ($BENCH_N0 + 1, + 2, …), so no two requests of a run are the same.
local f = assert(io.open(os.getenv("BENCH_BODY_FILE"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-Request-ID"] = os.getenv("BENCH_REQUEST_ID") or "bench"
local accept = os.getenv("BENCH_ACCEPT")
if accept and accept ~= "" then
  wrk.headers["Accept"] = accept
end

local template = wrk.body
if template:find("__N__", 1, true) then
  local n = tonumber(os.getenv("BENCH_N0") or "0")
  request = function()
    n = n + 1
    local body = template:gsub("__N__", tostring(n))
    return wrk.format(nil, nil, nil, body)
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_RESULT {"requests":%d,"duration_us":%d,"bytes":%d,"connect":%d,"read":%d,"write":%d,' ..
    '"status":%d,"timeout":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"mean_us":%.1f,"max_us":%d}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean, latency.max))
end
