import pytest


def pytest_addoption(parser):
    parser.addoption("--update-snapshots", action="store_true", default=False,
                     help="rewrite tests/snapshots/*.c from the current code generator")


@pytest.fixture
def update_snapshots(request) -> bool:
    return request.config.getoption("--update-snapshots")


@pytest.fixture(scope="session")
def kernel_cache(tmp_path_factory):
    """A compiler config whose kernel cache lives in a per-session temp dir."""
    from superopt.runtime.compiler import CompilerConfig

    return CompilerConfig(cache_dir=tmp_path_factory.mktemp("kernels"))
