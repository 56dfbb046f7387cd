"""`python tests/gcs_emulator.py start --port P ...`: gcp-storage-emulator (a local Cloud Storage server, used by
tests/test_bucket.py) with two gaps to the Cloud Storage JSON API filled:

- the x-goog-generation and x-goog-metageneration headers of an object download, which Cloud Storage always
  sends: TensorStore (orbax's checkpoint I/O) reads the object's generation from them and fails without;
- objects.moveTo (a rename within a bucket), which gcsfs tries first for every file it moves: without it each
  move fails with 501 after gcsfs's retries (seconds each) before gcsfs falls back to copy and delete.

Everything else is the emulator as published."""

from http import HTTPStatus

from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

_download = objects.download


def download(request, response, storage, *args, **kwargs):
  _download(request, response, storage, *args, **kwargs)
  try:
    obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
  except NotFound:
    return
  response["x-goog-generation"] = obj["generation"]
  response["x-goog-metageneration"] = obj["metageneration"]


def move(request, response, storage, *args, **kwargs):
  bucket, source, target = (request.params[k] for k in ("bucket_name", "object_id", "dest_object_id"))
  try:
    moved = objects._copy(request.base_url, storage, bucket, source, bucket, target)  # pylint: disable=protected-access
  except NotFound:
    response.status = HTTPStatus.NOT_FOUND
    return
  storage.delete_file(bucket, source)
  response.json(moved)


objects.download = download  # before the server module builds its routes from it

if __name__ == "__main__":
  from gcp_storage_emulator import server  # pylint: disable=g-import-not-at-top
  from gcp_storage_emulator import settings  # pylint: disable=g-import-not-at-top
  from gcp_storage_emulator.__main__ import main  # pylint: disable=g-import-not-at-top

  server.HANDLERS = (
    (
      rf"^{settings.API_ENDPOINT}/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)/moveTo/o/"
      r"(?P<dest_object_id>.*[^/]+)$",
      {server.POST: move},
    ),
    *server.HANDLERS,
  )
  main()
