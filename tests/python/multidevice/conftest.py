pytest_plugins = ["meshfuser.testing"]
