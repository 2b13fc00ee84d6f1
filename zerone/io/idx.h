// IDX files (the MNIST / Fashion-MNIST format), raw or gzip-compressed, and image-classification
// datasets made of an images file and a labels file.
//
// IDX: 2 zero bytes, a type byte (0x08: unsigned bytes, the only type read here), a byte with the
// number of dimensions D, then D big-endian uint32 sizes, then the elements in row-major order.
// The file must hold exactly that many bytes: a short or long file is an error. gzip is
// recognised by its magic bytes (1f 8b), not by the name.
//
// Ownership: the results own their bytes. Failure: Error naming the file and what was wrong and
// expected (missing, not IDX, wrong type or dimensions, truncated, trailing bytes, counts that
// disagree). Thread-safety: plain functions and values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zerone::io {

struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;  // prod(dims) bytes
};

// Reads an IDX file of unsigned bytes whose number of dimensions is one of `allowed_dims`.
// `what` names the file's role in messages ("--data images").
IdxArray read_idx(const std::string& path, const std::vector<int>& allowed_dims, const std::string& what);

// Images and labels of one split ("train" or "t10k") of a directory in the MNIST layout:
// <split>-images-idx3-ubyte (N, H, W) or -idx4-ubyte (N, C, H, W), and <split>-labels-idx1-ubyte
// (N), each raw or with .gz (the raw file is preferred when both exist).
struct ImageDataset {
  std::string images_path, labels_path;
  int64_t count = 0;
  std::vector<int64_t> sample_shape;  // {C, H, W}; C = 1 for idx3
  std::vector<uint8_t> pixels;        // (count, C, H, W)
  std::vector<uint8_t> labels;        // (count)
  size_t sample_numel() const;
};

// Whether `dir` is a directory holding the <split> images file (either form).
bool has_image_split(const std::string& dir, const std::string& split);
// Loads the split. `flag` names where the directory came from in messages ("--data").
ImageDataset load_image_split(const std::string& dir, const std::string& split, const std::string& flag);

}  // namespace zerone::io
