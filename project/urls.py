from django.contrib import admin
from django.urls import path

from chat import views

urlpatterns = [
    path("", views.index, name="index"),
    path("api/conversations/", views.conversations, name="conversations"),
    path("api/conversations/<int:conversation_id>/", views.conversation, name="conversation"),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", views.metrics, name="metrics"),
    path("admin/", admin.site.urls),
]
