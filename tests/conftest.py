import keras
import pytest


@pytest.fixture(autouse=True)
def _reset_policy():
    """Every test starts and ends under the float32 policy."""
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")
