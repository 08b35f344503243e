// The Python face of deloco (docs/python.md): deloco._deloco, wrapped by python/deloco/__init__.py. One class over
// the caller-trained learner of deloco/embed.h; nothing of the algorithm or the protocol is here.
//
// Tensors cross as the same at::Tensor objects Python holds (torch's own pybind11 caster), so merged fragments are
// written into the model's parameter storage in place. Every call that may wait on the network (the join in the
// constructor, step, close) releases the GIL. C++ exceptions arrive as Python exceptions with the same message:
// ConfigError (a ValueError), IoError (an OSError); the rest as RuntimeError.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/utils/pybind.h>
#include <pybind11/stl.h>

#include "deloco/config.h"
#include "deloco/embed.h"

namespace py = pybind11;

namespace {

using Named = std::vector<std::pair<std::string, at::Tensor>>;

std::unique_ptr<deloco::EmbeddedLearner> make_learner(Named params, std::string config, std::vector<std::string> sets,
                                                      int64_t learner_id, std::string connect, std::string secret_key,
                                                      std::string syncer_key, std::string out) {
  deloco::EmbeddedLearnerOptions o;
  o.config = std::move(config);
  o.sets = std::move(sets);
  o.learner_id = learner_id;
  o.connect = std::move(connect);
  o.secret_key = std::move(secret_key);
  o.syncer_key = std::move(syncer_key);
  o.out = std::move(out);
  py::gil_scoped_release release;
  return std::make_unique<deloco::EmbeddedLearner>(o, std::move(params));
}

}  // namespace

PYBIND11_MODULE(_deloco, m) {
  m.doc() = "deloco's C++ learner runtime (use the deloco package, not this module)";
  py::register_exception<deloco::ConfigError>(m, "ConfigError", PyExc_ValueError);
  py::register_exception<deloco::IoError>(m, "IoError", PyExc_OSError);
  m.def(
      "_read_config",
      [](std::string config, std::vector<std::string> sets) {
        deloco::EmbeddedLearnerOptions o;
        o.config = std::move(config);
        o.sets = std::move(sets);
        return deloco::read_learner_config(o).dump();
      },
      py::arg("config"), py::arg("sets"));
  py::class_<deloco::EmbeddedLearner>(m, "_Learner")
      .def(py::init(&make_learner), py::arg("params"), py::arg("config"), py::arg("sets"), py::arg("learner_id"),
           py::arg("connect"), py::arg("secret_key"), py::arg("syncer_key"), py::arg("out"))
      .def("step", &deloco::EmbeddedLearner::step, py::arg("tokens"), py::arg("loss"),
           py::call_guard<py::gil_scoped_release>())
      .def("stop", &deloco::EmbeddedLearner::stop)
      .def("close", [](deloco::EmbeddedLearner& l) {
        std::string s;
        {
          py::gil_scoped_release release;
          s = l.close().dump();
        }
        return s;
      })
      .def_property_readonly("learner_id", &deloco::EmbeddedLearner::learner_id)
      .def_property_readonly("start_step", &deloco::EmbeddedLearner::start_step)
      .def_property_readonly("steps_done", &deloco::EmbeddedLearner::steps_done)
      .def_property_readonly("total_steps", &deloco::EmbeddedLearner::total_steps)
      .def_property_readonly("done", &deloco::EmbeddedLearner::done)
      .def_property_readonly("config_json", [](const deloco::EmbeddedLearner& l) { return l.config_json().dump(); });
}
