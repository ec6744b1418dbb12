#!/usr/bin/python3
"""zstd_blocks.py - copy the data sections of ringtrain shards into one file.

  zstd_blocks.py OUT SHARD.rts [SHARD.rts ...]

For each shard (docs/FORMAT.md), checks the magic, version and header size,
reads data_offset (u64 at byte 80) and file_size (u64 at byte 88) from the
128-byte little-endian header, and appends bytes [data_offset, file_size) to
OUT. With codec raw and zstd compression those bytes are the shard's blocks,
independent zstd frames back to back, so OUT is a valid multi-frame .zst file
that `zstd -d` decodes to the records' uint8 CHW pixels.

Prints one line: "<shards> <records> <stored bytes> <raw bytes>", where raw
bytes is the sum of the blocks' raw_size from the block index (what zstd -d
should produce). Exit 1 with a message on a shard it cannot use.
Standard library only.
"""
import struct
import sys

HEADER = struct.Struct("<8sIIIIIIIIIIQQQQQQQQQQ")  # 128 bytes, fields of docs/FORMAT.md
ENTRY = struct.Struct("<QIIIIQ")  # block index entry, 32 bytes


def fail(msg):
    sys.exit("zstd_blocks.py: " + msg)


def main(argv):
    if len(argv) < 3:
        fail("usage: zstd_blocks.py OUT SHARD.rts [SHARD.rts ...]")
    shards = records = stored = raw = 0
    with open(argv[1], "wb") as out:
        for path in argv[2:]:
            with open(path, "rb") as f:
                head = f.read(HEADER.size)
                if len(head) != HEADER.size:
                    fail("%s: shorter than the 128-byte header" % path)
                (magic, version, header_size, codec, compression, _split, _c, _h, _w, _k,
                 block_count, record_count, _first, _lo, index_offset, data_offset, file_size,
                 *_rest) = HEADER.unpack(head)
                if magic != b"RTSHARD\0" or version != 1 or header_size != 128:
                    fail("%s: not a version-1 ringtrain shard" % path)
                if codec != 0 or compression != 1:
                    fail("%s: codec %u, compression %u; need raw + zstd (codec 0, compression 1)"
                         % (path, codec, compression))
                f.seek(index_offset)
                index = f.read(ENTRY.size * block_count)
                if len(index) != ENTRY.size * block_count:
                    fail("%s: block index truncated" % path)
                raw += sum(ENTRY.unpack_from(index, i * ENTRY.size)[2] for i in range(block_count))
                f.seek(data_offset)
                n = 0
                while True:
                    chunk = f.read(1 << 22)
                    if not chunk:
                        break
                    out.write(chunk)
                    n += len(chunk)
                if n != file_size - data_offset:
                    fail("%s: data section is %d bytes, header says %d"
                         % (path, n, file_size - data_offset))
            shards += 1
            records += record_count
            stored += n
    print(shards, records, stored, raw)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
