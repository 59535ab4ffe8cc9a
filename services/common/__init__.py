"""The shared service runtime and the plain-data contract types every core uses."""
