// kolo::DistributedSampler from Python: the index arithmetic under
// kolo.torch.elastic.ElasticSampler (sharding, PyTorch's shuffle order,
// padding, and re-sharding what an earlier world had not taken).
#include "kolo/torch/sampler.h"

#include <pybind11/stl.h>
#include <torch/python.h>

#include <cstdint>
#include <vector>

#include "bindings.h"

namespace kolo::python {

void bind_sampler(py::module_& m) {
  py::class_<DistributedSampler>(
      m, "DistributedSampler",
      "kolo::DistributedSampler (kolo/torch/sampler.h): this rank's shard of a dataset's "
      "indices, in the order torch.utils.data.DistributedSampler gives.")
      .def(py::init([](size_t dataset_size, int rank, int size, bool shuffle, uint64_t seed,
                       bool drop_last) {
             DistributedSamplerOptions options;
             options.rank = rank;
             options.world_size = size;
             options.shuffle = shuffle;
             options.seed = seed;
             options.drop_last = drop_last;
             return new DistributedSampler(dataset_size, options);
           }),
           py::arg("dataset_size"), py::arg("rank"), py::arg("size"), py::arg("shuffle"),
           py::arg("seed"), py::arg("drop_last"))
      .def("set_epoch", &DistributedSampler::set_epoch, py::arg("epoch"))
      .def("set_epoch_start", &DistributedSampler::set_epoch_start, py::arg("start"),
           "Shards only positions start.. of the epoch's order (an earlier world took the rest).")
      .def("indices", &DistributedSampler::indices, "This rank's indices for the epoch.")
      .def("__len__", &DistributedSampler::size);
}

}  // namespace kolo::python
