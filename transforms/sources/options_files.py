"""The options of file collections (one Example per file): the labels, the bytes' feature, the image header."""

from __future__ import annotations

from pydantic import Field

from tfrecord_etl.transforms.sources.options import FlagGroup, FormatOptions


class FilesOptions(FormatOptions):
    """``--file_labels``, ``--file_feature``, ``--image_header``, ``--decode_check``."""

    flag_groups = (
        FlagGroup(
            "image and file collections",
            "one Example per file: its bytes, label and image header",
            "converting/files.md",
            ("--file_labels", "--file_feature", "--image_header", "--decode_check"),
        ),
    )

    file_labels: str = Field(
        "dir",
        min_length=1,
        description="files: dir (label = the class folder under the "
        "pattern's base), none, or the path of a CSV table file,label[,more columns]",
    )
    file_feature: str = Field(
        "image", pattern=r"^[A-Za-z0-9_.-]+$", description="files: the feature holding each file's bytes"
    )
    image_header: bool | None = Field(
        None,
        description="files: record <feature>/format, /height, /width, "
        "/channels from the image header (Pillow), a file that is not an image "
        "failing at planning; default: when any file is an image (a folder of "
        "other files converts as bytes and names)",
    )
    decode_check: bool = Field(
        False, description="files: decode every image fully; corrupt ones fail (or are dead-lettered)"
    )
