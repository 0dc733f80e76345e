#include "tutti/comm/mesh.h"

#include <cstdint>
#include <set>

#include "tutti/core/error.h"

namespace tutti {

namespace {

std::string dims_str(const std::vector<MeshDim>& dims) {
  std::string out;
  for (const MeshDim& d : dims) {
    if (!out.empty()) out += " x ";
    out += d.name + " " + (d.size == kMeshRest ? std::string("rest") : std::to_string(d.size));
  }
  return out;
}

}  // namespace

std::vector<MeshDim> DeviceMesh::resolve(std::vector<MeshDim> dims, int world) {
  TUTTI_CHECK_ARG(!dims.empty(), "DeviceMesh: a mesh needs at least one dimension");
  std::set<std::string> names;
  std::int64_t known = 1;
  MeshDim* rest = nullptr;
  for (MeshDim& d : dims) {
    TUTTI_CHECK_ARG(!d.name.empty(), "DeviceMesh: a dimension of ", dims_str(dims), " has no name");
    TUTTI_CHECK_ARG(names.insert(d.name).second, "DeviceMesh: the dimension '", d.name, "' appears twice in ",
                    dims_str(dims));
    if (d.size == kMeshRest) {
      TUTTI_CHECK_ARG(rest == nullptr,
                      "DeviceMesh: only one dimension can take the rest of the ranks (kMeshRest): ", dims_str(dims));
      rest = &d;
      continue;
    }
    TUTTI_CHECK_ARG(d.size > 0, "DeviceMesh: the dimension '", d.name, "' has size ", d.size,
                    ": a size must be positive, or kMeshRest");
    known *= d.size;
  }
  if (rest != nullptr) {
    TUTTI_CHECK_ARG(known <= world && world % known == 0, "DeviceMesh: ", dims_str(dims), ": the job's ", world,
                    " rank(s) are not a multiple of the other dimensions' ", known);
    rest->size = static_cast<int>(world / known);
    known = world;
  }
  TUTTI_CHECK_ARG(known == world, "DeviceMesh: a mesh of ", dims_str(dims), " holds ", known, " ranks, the job has ",
                  world);
  return dims;
}

std::vector<int> DeviceMesh::coordinates(const std::vector<MeshDim>& dims, int rank) {
  std::vector<int> out(dims.size());
  for (std::size_t i = dims.size(); i-- > 0;) {
    out[i] = rank % dims[i].size;
    rank /= dims[i].size;
  }
  return out;
}

int DeviceMesh::color(const std::vector<MeshDim>& dims, int rank, int dim) {
  const std::vector<int> c = coordinates(dims, rank);
  int out = 0;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (static_cast<int>(i) != dim) out = out * dims[i].size + c[i];
  }
  return out;
}

DeviceMesh::DeviceMesh(std::vector<MeshDim> dims, int rank, std::vector<std::shared_ptr<Communicator>> groups)
    : dims_(std::move(dims)), rank_(rank), coordinates_(coordinates(dims_, rank)), groups_(std::move(groups)) {
  TUTTI_CHECK_ARG(groups_.size() == dims_.size(), "DeviceMesh: ", groups_.size(), " group(s) for ", dims_.size(),
                  " dimension(s)");
}

int DeviceMesh::size() const {
  int n = 1;
  for (const MeshDim& d : dims_) n *= d.size;
  return n;
}

int DeviceMesh::index_of(std::string_view dim) const {
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    if (dims_[i].name == dim) return static_cast<int>(i);
  }
  TUTTI_THROW(InvalidArgument, "DeviceMesh: no dimension '", dim, "' in the mesh ", str());
}

int DeviceMesh::size(std::string_view dim) const { return dims_[static_cast<std::size_t>(index_of(dim))].size; }

int DeviceMesh::coordinate(std::string_view dim) const { return coordinates_[static_cast<std::size_t>(index_of(dim))]; }

std::shared_ptr<Communicator> DeviceMesh::group_ptr(std::string_view dim) const {
  return groups_[static_cast<std::size_t>(index_of(dim))];
}

std::string DeviceMesh::str() const { return dims_.empty() ? "(empty)" : dims_str(dims_); }

}  // namespace tutti
