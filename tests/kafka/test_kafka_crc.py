"""kafka-python checks record CRCs with the ``crc32c`` package, not in pure Python."""

import crc32c
from kafka.record import default_records, util


def test_record_batches_are_checked_with_the_crc32c_package():
    """kafka-python binds its CRC32C implementation when ``kafka.record.util`` is
    imported: the C one if ``crc32c`` imports, else a pure-Python loop."""
    assert util.crc32c_c is crc32c.crc32c
    # the function record batches call, with the implementation it bound at import
    assert default_records.calc_crc32c.__defaults__ == (crc32c.crc32c,)
    assert default_records.calc_crc32c.__defaults__ != (util.crc32c_py,)


def test_the_fast_path_computes_crc32c():
    assert default_records.calc_crc32c(memoryview(b"123456789")) == 0xE3069283
    assert default_records.calc_crc32c(memoryview(b"x" * 1000)) == util.crc32c_py(b"x" * 1000)
