// The alloc hook's failure path: turns berth's "cannot serve this request" into the Python
// exception a PyTorch user expects, from inside PyTorch's C++ call stack.
//
// Note [Raising from the alloc hook]
// PyTorch's CUDAPluggableAllocator treats whatever `alloc` returns as the allocation: a NULL
// becomes a tensor with a null data pointer (measured with torch 2.11), and the first kernel
// that touches it faults. PyTorch's own allocator throws `c10::OutOfMemoryError`, which the
// Python bindings turn into `torch.OutOfMemoryError`. berth cannot construct PyTorch's C++
// exception types without PyTorch's headers and libraries at build time, but the bindings'
// handler (torch/csrc/Exceptions.h, CATCH_CORE_ERRORS:
// https://github.com/pytorch/pytorch/blob/main/torch/csrc/Exceptions.h) catches first a
// `python_error`: "the python error flags have been already set", a std::exception carrying a
// Python exception as (type, value, traceback) that it hands back to the interpreter with
// PyErr_Restore. C++ matches exception types by their mangled name across shared libraries
// (the Itanium ABI's type_info comparison, which libstdc++ does by name), so a struct of the
// same name and layout thrown here is caught there, and the user sees torch.OutOfMemoryError
// with berth's message; the autograd engine forwards it across threads the same way (it
// catches std::exception and rethrows the same object). The layout (std::exception, then
// type, value, traceback, then std::string message) is the same in every PyTorch release
// since 1.0. The Python C API is reached through dlsym: the functions are in the process
// (the interpreter loaded PyTorch and this library), and the library still loads where there
// is no Python (the Rust tests, the ctypes smoke test), where the hook returns NULL instead.

#include <dlfcn.h>

#include <atomic>
#include <cstddef>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>

extern "C" void* berth_torch_try_alloc(size_t size, int device, void* stream);
extern "C" size_t berth_torch_last_error(char* buf, size_t len);
extern "C" int berth_torch_last_error_is_oom(void);

typedef struct _object PyObject;

namespace {

// The few CPython functions used, resolved once by berth_torch_set_python_exception.
struct PyApi {
    int (*gil_ensure)(void);  // PyGILState_Ensure (PyGILState_STATE is an int enum)
    void (*gil_release)(int);
    PyObject* (*unicode_from_string)(const char*);
    PyObject* (*call_function_obj_args)(PyObject*, ...);
    void (*inc_ref)(PyObject*);
    void (*dec_ref)(PyObject*);
    void (*err_clear)(void);
    PyObject** runtime_error;  // &PyExc_RuntimeError
};

PyApi g_py;
std::atomic<PyObject*> g_oom_class{nullptr};

template <typename F>
bool resolve(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
    return f != nullptr;
}

std::string last_error() {
    std::string msg(berth_torch_last_error(nullptr, 0) + 1, '\0');
    size_t n = berth_torch_last_error(&msg[0], msg.size());
    msg.resize(n);
    if (msg.empty()) msg = "berth: allocation failed";
    return msg;
}

}  // namespace

// PyTorch's exception for "a Python error is set", same name and layout as in
// torch/csrc/Exceptions.h; see Note [Raising from the alloc hook].
struct python_error : public std::exception {
    python_error() : type(nullptr), value(nullptr), traceback(nullptr) {}
    python_error(const python_error& other)
        : type(other.type), value(other.value), traceback(other.traceback), message(other.message) {
        int g = g_py.gil_ensure();
        if (type) g_py.inc_ref(type);
        if (value) g_py.inc_ref(value);
        if (traceback) g_py.inc_ref(traceback);
        g_py.gil_release(g);
    }
    python_error(python_error&& other) noexcept
        : type(other.type), value(other.value), traceback(other.traceback),
          message(std::move(other.message)) {
        other.type = nullptr;
        other.value = nullptr;
        other.traceback = nullptr;
    }
    ~python_error() override {
        if (type || value || traceback) {
            int g = g_py.gil_ensure();
            if (type) g_py.dec_ref(type);
            if (value) g_py.dec_ref(value);
            if (traceback) g_py.dec_ref(traceback);
            g_py.gil_release(g);
        }
    }
    const char* what() const noexcept override { return message.c_str(); }

    PyObject* type;
    PyObject* value;
    PyObject* traceback;
    std::string message;
};

// Registers the exception class raised for out-of-memory (torch.OutOfMemoryError; the caller
// keeps a reference for the life of the process) and resolves the Python C API. Called from
// Python with the GIL held. Returns 0, or -1 when the process has no Python interpreter.
extern "C" int berth_torch_set_python_exception(PyObject* oom_class) {
    bool ok = resolve(g_py.gil_ensure, "PyGILState_Ensure") &&
              resolve(g_py.gil_release, "PyGILState_Release") &&
              resolve(g_py.unicode_from_string, "PyUnicode_FromString") &&
              resolve(g_py.call_function_obj_args, "PyObject_CallFunctionObjArgs") &&
              resolve(g_py.inc_ref, "Py_IncRef") && resolve(g_py.dec_ref, "Py_DecRef") &&
              resolve(g_py.err_clear, "PyErr_Clear") &&
              resolve(g_py.runtime_error, "PyExc_RuntimeError");
    if (!ok || oom_class == nullptr) return -1;
    g_oom_class.store(oom_class);
    return 0;
}

// The alloc hook's body: berth_torch_try_alloc, and for a failed non-zero request a
// python_error carrying torch.OutOfMemoryError (or RuntimeError for other failures) once
// Python registered its class; NULL before that (no Python in the process).
extern "C" void* berth_torch_alloc_or_throw(size_t size, int device, void* stream) {
    void* p = berth_torch_try_alloc(size, device, stream);
    if (p != nullptr || size == 0) return p;
    PyObject* oom = g_oom_class.load();
    if (oom == nullptr) return nullptr;
    PyObject* cls = berth_torch_last_error_is_oom() ? oom : *g_py.runtime_error;
    std::string msg = last_error();
    python_error err;
    int g = g_py.gil_ensure();
    PyObject* text = g_py.unicode_from_string(msg.c_str());
    PyObject* value = text ? g_py.call_function_obj_args(cls, text, nullptr) : nullptr;
    if (text) g_py.dec_ref(text);
    if (value == nullptr) {
        // The exception object could not be made: PyTorch turns any std::exception into a
        // RuntimeError, which still beats handing out a null pointer.
        g_py.err_clear();
        g_py.gil_release(g);
        throw std::runtime_error(msg);
    }
    g_py.inc_ref(cls);
    err.type = cls;
    err.value = value;
    err.message = msg;
    g_py.gil_release(g);
    throw python_error(std::move(err));
}
