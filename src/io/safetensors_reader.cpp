#include "core/error.h"
#include "io/safetensors.h"

namespace moeserve::io {

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->mapping_ = MappedFile::open(path);
  file->header_ = parse_safetensors_header(file->mapping_->bytes(), path.string());
  for (size_t i = 0; i < file->header_.tensors.size(); ++i)
    file->index_.emplace(file->header_.tensors[i].name, i);
  return file;
}

SafetensorsFile::~SafetensorsFile() = default;

uint64_t SafetensorsFile::file_size() const { return mapping_->size(); }

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const TensorInfo* info = find(name);
  if (!info) fail("{}: no tensor named '{}'", path_.string(), name);
  // Offsets were checked against the file size at open.
  std::byte* data = mapping_->data() + header_.data_offset + info->data_begin;
  return Tensor(info->dtype, info->shape, data, mapping_);
}

}  // namespace moeserve::io
