"""The HTTP edge the rank server and the gateway share (and the `main()` all roles share).

- `errors.py`: `ApiError`, the one error type, and the handlers that answer every error as
  `{"detail", "field"}` with the field named as the request spells it;
- `edge.py`: `build_app` (service object + routers + the edge), bearer auth checked before
  the body is read, the streaming body limit, JSON 500s that keep the connection, the
  per-request hook;
- `serve.py`: `service_main` / `http_main`, config + logging + uvicorn.

Each server keeps its routes in `<role>/routes.py` (APIRouters whose handlers get the
service object through `app_service`) and its state and logic in `<role>/service.py`.
"""
