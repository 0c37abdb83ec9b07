"""spec.modelRepository in Triton's own spellings: a local path, s3:// (with an S3-compatible
store's host as Triton writes it), gs:// and as://; what Triton would read otherwise is
refused with what to write instead."""

from __future__ import annotations

import pytest

from reconciler.model.repository import RepositoryLocation, parse_repository


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/models", RepositoryLocation("/models", "file", path="/models")),
        ("models/edge", RepositoryLocation("models/edge", "file", path="models/edge")),
        ("s3://bucket", RepositoryLocation("s3://bucket", "s3", bucket="bucket")),
        (
            "s3://my.bucket-1/team/models/",
            RepositoryLocation(
                "s3://my.bucket-1/team/models/", "s3", bucket="my.bucket-1", prefix="team/models"
            ),
        ),
        (
            "s3://http://127.0.0.1:9000/models/prod",
            RepositoryLocation(
                "s3://http://127.0.0.1:9000/models/prod",
                "s3",
                bucket="models",
                prefix="prod",
                endpoint="http://127.0.0.1:9000",
            ),
        ),
        (
            "s3://https://minio.internal:443/models",
            RepositoryLocation(
                "s3://https://minio.internal:443/models",
                "s3",
                bucket="models",
                endpoint="https://minio.internal:443",
            ),
        ),
        (
            "gs://gcs-bucket/models",
            RepositoryLocation(
                "gs://gcs-bucket/models", "gs", bucket="gcs-bucket", prefix="models"
            ),
        ),
        (
            "as://account1/container/models",
            RepositoryLocation(
                "as://account1/container/models",
                "as",
                bucket="container",
                prefix="models",
                account="account1",
            ),
        ),
    ],
)
def test_each_spelling_triton_reads_is_parsed(text: str, expected: RepositoryLocation) -> None:
    assert parse_repository(text) == expected


def test_the_root_is_what_fsspec_names_and_urls_keep_the_manifests_spelling() -> None:
    custom = parse_repository("s3://http://127.0.0.1:9000/models/prod")

    assert custom.root == "models/prod" and custom.remote
    assert custom.model_url("echo", "3") == "s3://http://127.0.0.1:9000/models/prod/echo/3"
    assert parse_repository("/models").root == "/models"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("http://minio:9000/models", "local path, s3://, gs:// or as://, not http://"),
        ("file:///models", "not file://"),
        ("s3://http://minio.internal/models", "s3://http://HOST:PORT/BUCKET/PREFIX"),
        ("s3://Models/prod", "bucket 'Models' is not 3-63 characters"),
        ("s3://ab/prod", "bucket 'ab'"),
        ("s3://bucket/../other", "path segment '..'"),
        ("s3://bucket/a//b", "path segment ''"),
        ("gs://bucket/my models", "path segment 'my models'"),
        ("as://account1", "as://ACCOUNT/CONTAINER/PREFIX"),
        ("as://Account/container", "storage account 'Account'"),
        (" /models", "spaces around it"),
    ],
)
def test_what_triton_would_read_otherwise_is_refused(text: str, words: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_repository(text)

    assert words in str(refused.value), str(refused.value)
