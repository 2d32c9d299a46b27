//! Errors across the boundary: status codes, the thread's last error message, and the guard
//! every exported function runs its body in (a failure or a panic becomes a status code and a
//! message, never an unwind into C).

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use memsnap_format::FormatError;
use recorder::Error;

pub const MEMSNAP_OK: c_int = 0;
pub const MEMSNAP_ERR_INVALID_ARGUMENT: c_int = 1;
pub const MEMSNAP_ERR_OUT_OF_MEMORY: c_int = 2;
pub const MEMSNAP_ERR_IO: c_int = 3;
pub const MEMSNAP_ERR_BACKEND: c_int = 4;
pub const MEMSNAP_ERR_INTERNAL: c_int = 5;

/// A failure of a C ABI call: a status code and a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct FfiError {
    pub code: c_int,
    pub message: String,
}

impl FfiError {
    pub fn invalid(message: impl Into<String>) -> Self {
        FfiError {
            code: MEMSNAP_ERR_INVALID_ARGUMENT,
            message: message.into(),
        }
    }
}

impl From<Error> for FfiError {
    fn from(err: Error) -> Self {
        let code = match &err {
            Error::OutOfMemory(_) => MEMSNAP_ERR_OUT_OF_MEMORY,
            Error::Device { .. } => MEMSNAP_ERR_BACKEND,
            Error::Dump(_) => MEMSNAP_ERR_IO,
            _ => MEMSNAP_ERR_INVALID_ARGUMENT,
        };
        FfiError {
            code,
            message: err.to_string(),
        }
    }
}

impl From<FormatError> for FfiError {
    fn from(err: FormatError) -> Self {
        FfiError {
            code: MEMSNAP_ERR_IO,
            message: err.to_string(),
        }
    }
}

pub type FfiResult<T> = Result<T, FfiError>;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = text);
}

/// The thread's last error message (`memsnap_last_error()`): valid until the next failing
/// memsnap call on this thread.
pub fn last_error_ptr() -> *const c_char {
    static EMPTY: &CStr = c"";
    catch_unwind(|| {
        LAST_ERROR
            .try_with(|slot| slot.borrow().as_ptr())
            .unwrap_or(EMPTY.as_ptr())
    })
    .unwrap_or(EMPTY.as_ptr())
}

/// The thread's last error message, copied.
pub fn last_error_string() -> String {
    LAST_ERROR
        .try_with(|slot| slot.borrow().to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned())
}

/// Runs `body`; a failure or a panic sets the last error and yields `fallback`.
pub fn guarded<T>(fallback: T, body: impl FnOnce() -> FfiResult<T>) -> (T, c_int) {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => (value, MEMSNAP_OK),
        Ok(Err(err)) => {
            set_last_error(&err.message);
            (fallback, err.code)
        }
        Err(payload) => {
            set_last_error(&format!(
                "internal error in memsnap (please report it): {}",
                panic_message(payload.as_ref())
            ));
            (fallback, MEMSNAP_ERR_INTERNAL)
        }
    }
}

/// [`guarded`] for functions that return only a status.
pub fn status(body: impl FnOnce() -> FfiResult<()>) -> c_int {
    guarded((), body).1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_inside_are_caught_and_reported() {
        // The guard every exported function uses: a panic becomes MEMSNAP_ERR_INTERNAL.
        let code = status(|| panic!("boom"));
        assert_eq!(code, MEMSNAP_ERR_INTERNAL);
        assert!(
            last_error_string().contains("boom"),
            "{}",
            last_error_string()
        );
    }

    #[test]
    fn failures_set_the_code_and_the_message() {
        let code = status(|| Err(FfiError::invalid("bad\0value")));
        assert_eq!(code, MEMSNAP_ERR_INVALID_ARGUMENT);
        assert_eq!(last_error_string(), "bad value");
        assert_eq!(guarded(7, || Ok(3)), (3, MEMSNAP_OK));
    }
}
