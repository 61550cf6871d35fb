"""What the server (``cascade``) and the client (``cascade_client``) share: the wire formats.

``sse``: Server-Sent Events framing, the streams' error event and the one incremental parser;
``topk_format``: the binary layout of a top-k export; ``ordered``: bounded, in-order concurrency.

Standard library only. Nothing here may import ``cascade``, ``cascade_client``, ``fastapi``,
``vllm``, ``torch`` or ``numpy`` (``tests/unit/test_wire_boundary.py`` checks it): the client
installs without the server's dependencies, and the server never imports the client.
"""
