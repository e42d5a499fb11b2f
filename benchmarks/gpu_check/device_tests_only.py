"""pytest plugin (``-p benchmarks.gpu_check.device_tests_only``): keep only the tests that take the ``device``
fixture, so the set run on the GPU follows the tests themselves (a test converted to take ``device`` joins it)."""


def pytest_collection_modifyitems(config, items):
    keep = [item for item in items if "device" in getattr(item, "fixturenames", ())]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep
