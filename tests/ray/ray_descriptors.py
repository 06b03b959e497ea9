"""Print the FileDescriptorProtos Ray 2.60 embeds, as JSON (base64), for the comparison test.

Run as a separate process (`python tests/ray/ray_descriptors.py`): it imports `ray`'s
generated modules, whose full names clash with raysize's own protos in one process.
"""

from __future__ import annotations

import base64
import json
import sys

from google.protobuf import descriptor_pb2
from ray.core.generated import (
    autoscaler_pb2,
    common_pb2,
    gcs_pb2,
    gcs_service_pb2,
    node_manager_pb2,
)

out = []
for module in (autoscaler_pb2, common_pb2, gcs_pb2, gcs_service_pb2, node_manager_pb2):
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)
    out.append(base64.b64encode(proto.SerializeToString()).decode())
json.dump(out, sys.stdout)
