-- wrk: POST a small JSON tool call, as an agent would.
wrk.method = "POST"
wrk.body = '{"location": "Tokyo, Japan", "units": "metric", "lat": 35.6, "lon": 139.7}'
wrk.headers["Content-Type"] = "application/json"
